"""The real server with a reasoning chat template: plain clients (``--auto-splice``) and who made each edit.

The server's own full render of each request is the prompt it serves; its splice is checked by
the engine (``apply(base, D)`` a prefix of that prompt, else ``prompt_mismatch``), so a turn
served without a fallback is a turn whose directives reproduced the render.
"""

from __future__ import annotations

import openai

from benchmarks.traces import REASONING_TEMPLATE, TOOLS, messages_at, reasoning_agent_trace
from leyline_sdk.core.directives import apply
from leyline_sdk.explain.templates import Transcript
from leyline_sdk.render.rendering import normalize_messages
from leyline_server.api.conversations import RecognisedTurn
from leyline_server.api.render import message_digests
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


async def test_the_server_explains_the_templates_edits_and_no_other_conversation():
    service = reasoning_service()
    chat = service.chat
    steps = reasoning_agent_trace(turns=11, output_lines=12)
    before = messages_at(steps, 9)
    old = chat.render(before, tools=TOOLS)
    base = old.tokens + chat.encode("noise the model said<|im_end|>")[0]
    session = service.sessions.open(None, None)
    session.handle = await service.engine.open(base, session.scope)
    conversations = service.conversations
    msgs = normalize_messages(before)
    digest = message_digests(msgs, TOOLS)[-1]
    conversations.commit(session, RecognisedTurn(old.tokens, Transcript(msgs, TOOLS, old), None, {}, digest))
    conversations.replied(session, steps[9].answer)  # the reply the server generated (its tool-call ids)
    turn = await conversations.prepare(None, messages_at(steps, 10), TOOLS)
    assert turn is not None and turn.session is session  # its own previous turn, extended
    request = await conversations.edits_request(session, turn)
    assert request is not None
    result = apply(base, request.directives)
    assert turn.tokens[: len(result)] == result  # the server's own render is the oracle
    assert set(turn.sources) == {"template"} and len(turn.sources) == len(request.directives)
    edited = messages_at(steps, 10)
    edited[3] = {**edited[3], "content": "[evicted]"}  # the client stubbed an old tool output itself
    mine = await conversations.prepare(None, edited, TOOLS)
    assert mine is not None and mine.session is session  # it carries this session's reply: the same conversation
    request = await conversations.edits_request(session, mine)
    assert request is not None and "client" in mine.sources
    assert apply(base, request.directives) == mine.tokens[: len(apply(base, request.directives))]
    forgets = [d for d, src in zip(request.directives, mine.sources, strict=True) if src == "client"]
    assert forgets and all(d.mode.value == "forget" for d in forgets)  # no opt-in: exact from the edit on
    rewritten = messages_at(steps, 10)
    rewritten[len(before)] = {**rewritten[len(before)], "content": "an answer the server did not write"}
    other = await conversations.prepare(None, rewritten, TOOLS)
    assert other is not None and other.session is session and not other.reply_proven  # its exact prefix
    request = await conversations.edits_request(session, other)
    kept = apply(base, request.directives) if request else base[: len(old.tokens)]
    reply_start = other.transcript.render.message_spans[len(before)].start
    assert len(kept) <= reply_start and other.tokens[: len(kept)] == kept  # nothing kept from the reply on
    await service.shutdown()
