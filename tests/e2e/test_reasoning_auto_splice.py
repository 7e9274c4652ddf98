"""The real server with a reasoning chat template: plain clients (``--auto-splice``) and who made each edit.

The server's own full render of each request is the prompt it serves; its splice is checked by
the engine (``apply(base, D)`` a prefix of that prompt, else ``prompt_mismatch``), so a turn
served without a fallback is a turn whose directives reproduced the render.
"""

from __future__ import annotations

import openai

from benchmarks.traces import REASONING_TEMPLATE, TOOLS, messages_at, reasoning_agent_trace
from leyline_sdk.directives import apply
from leyline_sdk.templates import Transcript
from leyline_server.api.splicing import auto_splice
from tests.e2e.server_helpers import make_service, running_server


def reasoning_service(**config):
    service = make_service(auto_splice=True, max_context_tokens=8192, kv_budget_mb=32, **config)
    service.tokenizer.chat_template = REASONING_TEMPLATE  # the service's own copy of the tiny tokenizer
    return service


async def test_a_plain_client_on_a_reasoning_template_is_spliced_not_reprefilled():
    steps = reasoning_agent_trace(turns=11, output_lines=12)
    prefilled = {}
    for auto in (True, False):
        service = reasoning_service() if auto else make_service(max_context_tokens=8192, kv_budget_mb=32)
        service.tokenizer.chat_template = REASONING_TEMPLATE
        with running_server(service) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            for t, step in enumerate(steps):
                r = await client.chat.completions.create(
                    model="tiny-mla", messages=messages_at(steps, t), tools=TOOLS, max_tokens=1
                )
                if step.kind == "query" and t:
                    ext = r.leyline if auto else None
                    if auto:
                        assert ext["auto_splice"] and ext["fallback"] is None and ext["rotated_tokens"] > 0, ext
                        assert ext["template_directives"] > 0 and "template" in ext["sources"], ext
                    details = r.usage.prompt_tokens_details
                    prefilled[(auto, t)] = r.usage.prompt_tokens - (details.cached_tokens if details else 0)
    for t in (5, 10):  # the query turns: plain prefix caching re-prefills from the first stripped block
        assert prefilled[(True, t)] * 3 < prefilled[(False, t)], prefilled


def test_the_server_tells_the_clients_edits_from_the_templates():
    service = reasoning_service()
    chat = service.chat
    steps = reasoning_agent_trace(turns=11, output_lines=12)
    before = messages_at(steps, 9)
    old = chat.render(before, tools=TOOLS)
    base = old.tokens + chat.encode("noise the model said<|im_end|>")[0]
    edited = messages_at(steps, 10)
    edited[3] = {**edited[3], "content": "[evicted]"}  # the client stubbed an old tool output itself
    prompt = chat.render(edited, tools=TOOLS)
    session = service.sessions.open(None, None)
    for incoming, sources in ((Transcript(edited, TOOLS, prompt), {"template", "client"}), (None, {"client"})):
        session.transcript, session.incoming = Transcript(before, TOOLS, old), incoming
        request = auto_splice(service, session, base, prompt.tokens)
        assert request is not None
        result = apply(base, request.directives)
        assert prompt.tokens[: len(result)] == result  # the server's own render is the oracle
        assert set(session.auto_sources) == sources and len(session.auto_sources) == len(request.directives)
        assert session.transcript is incoming and session.incoming is None  # this request is the next one's base
    assert auto_splice(service, session, prompt.tokens[:50], prompt.tokens) is None  # a plain extension
