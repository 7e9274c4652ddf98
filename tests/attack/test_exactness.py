"""Round three, finding 3: approximate KV reaches only the turns that asked for it.

Before: after one turn of a conversation was spliced under ``X-Leyline-Client-Edits: amortize``,
the next turn without the header was served 611 approximate tokens, with the header ``exact``
633, and another client continuing it through ``previous_response_id`` 663 — the docs promise 0
to every request that did not ask for ``amortize``.

Now a session an amortize turn left approximate KV in is continued only by amortize turns; any
other request of that conversation gets a new session that reuses the exact prefix and computes
the rest: 0 approximate tokens, the answer of a fresh server.

Round four: on a chat template that drops earlier reasoning, ``X-Leyline-Client-Edits: exact``
still spliced the *template's* edits in ``amortize`` mode (1,109–2,728 approximate tokens a turn
over an 11-turn agent trace, on a server without ``--auto-splice``), and continued a session that
``--auto-splice`` had left approximate KV in. Now ``exact`` recomputes every edit and opens a new
session instead of continuing approximate KV.
"""

from __future__ import annotations

from typing import Any

import openai

from benchmarks.traces import REASONING_TEMPLATE, TOOLS, messages_at, reasoning_agent_trace
from tests.attack.helpers import MODEL, serve, service

FILE = "".join(f"line {i}: value_{i} = {i * i}\n" for i in range(40))
AMORTIZE, EXACT = {"X-Leyline-Client-Edits": "amortize"}, {"X-Leyline-Client-Edits": "exact"}


def opening(topic: str, output: str) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "user", "content": f"Read the {topic} file."},
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": output},
        {"type": "message", "role": "user", "content": "What is in it?"},
    ]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def ask(client: openai.AsyncOpenAI, items: list[dict[str, Any]], headers: dict[str, str] | None = None,
              **fields: Any) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    """One response (greedy, 4 tokens): its body and headers."""
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=items, max_output_tokens=4, temperature=0, extra_headers=headers or {}, **fields
    )
    return raw.parse().model_dump(), dict(raw.headers)


def approximate(headers: dict[str, str]) -> int:
    return int(headers["x-leyline-approximate-tokens"])


def replied(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The response's output items as the next request sends them back."""
    out = [{k: v for k, v in item.items() if v is not None} for item in body["output"]]
    assert out, body  # a reply the next request is recognised by
    return out


async def spliced(client: openai.AsyncOpenAI, topic: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """A conversation whose second turn was spliced under amortize: (that response, the next
    request's items, its session)."""
    first, _ = await ask(client, opening(topic, FILE))
    edited = [*opening(topic, "[cleared]"), *replied(first), user("And then?")]  # the client cleared the output
    second, headers = await ask(client, edited, AMORTIZE)
    assert approximate(headers) > 0, headers  # it asked: spliced, approximate from the edit on
    return second, [*edited, *replied(second), user("Go on.")], headers["x-leyline-session"]


async def test_only_turns_that_asked_for_amortize_get_approximate_kv(engine):
    with serve(service(engine, auto_splice=True)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        another = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        _, later, _ = await spliced(client, "plain")
        plain, plain_headers = await ask(client, later)  # the same client, without the header
        _, later_exact, _ = await spliced(client, "exact")
        exact, exact_headers = await ask(client, later_exact, EXACT)
        second, _, _ = await spliced(client, "chained")
        chained, chained_headers = await ask(another, [user("Go on.")], previous_response_id=second["id"])
        _, later_again, session = await spliced(client, "again")
        _, again_headers = await ask(client, later_again, AMORTIZE)
    assert [approximate(h) for h in (plain_headers, exact_headers, chained_headers)] == [0, 0, 0]
    for body in (plain, exact, chained):
        assert body["leyline"]["approximate_tokens"] == 0 and body["leyline"]["reused_tokens"] > 0, body["leyline"]
    assert approximate(again_headers) > 0  # the amortize client still has its spliced path
    assert again_headers["x-leyline-session"] == session
    with serve(service(engine)) as url:  # the oracle: a server that never saw these conversations
        fresh_client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        fresh, _ = await ask(fresh_client, later)
        fresh_exact, _ = await ask(fresh_client, later_exact)
    assert plain["leyline"]["completion_token_ids"] == fresh["leyline"]["completion_token_ids"]
    assert exact["leyline"]["completion_token_ids"] == fresh_exact["leyline"]["completion_token_ids"]


def reasoning(engine: str, **config: Any) -> Any:
    """A service whose chat template drops earlier turns' reasoning (the template edits every turn)."""
    svc = service(engine, kv_budget_mb=32.0, max_context_tokens=4096, **config)
    svc.tokenizer.chat_template = REASONING_TEMPLATE  # the service's own copy of the tokenizer
    return svc


async def chat_turns(url: str, steps: list[Any], headers: dict[str, str] | None = None) -> list[tuple[int, list[int]]]:
    """Each turn of the trace, greedy, 4 tokens: (approximate tokens, completion token ids)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, default_headers=headers)
    out = []
    for t in range(len(steps)):
        r = await client.chat.completions.create(
            model=MODEL, messages=messages_at(steps, t), tools=TOOLS, max_tokens=4, temperature=0
        )
        out.append((r.leyline["approximate_tokens"], r.leyline["completion_token_ids"]))
    return out


async def test_exact_recomputes_the_templates_edits_too(engine):
    steps = reasoning_agent_trace(turns=11, output_lines=6)
    with serve(reasoning(engine)) as url:
        asked = await chat_turns(url, steps, AMORTIZE)
        exact = await chat_turns(url, steps, EXACT)
    with serve(reasoning(engine, auto_splice=True)) as url:
        auto = await chat_turns(url, steps)  # the operator's default splices the template's edits
        exact_after_auto = await chat_turns(url, steps, EXACT)  # the same conversation, asked exact
    assert sum(a for a, _ in asked) > 0 and sum(a for a, _ in auto) > 0  # the template did edit
    assert [a for a, _ in exact] == [0] * len(steps)
    assert [a for a, _ in exact_after_auto] == [0] * len(steps)
    with serve(reasoning(engine)) as url:  # the oracle: no sessions, the exact prefix cache alone
        fresh = await chat_turns(url, steps)
    assert [ids for _, ids in exact] == [ids for _, ids in fresh]
    assert [ids for _, ids in exact_after_auto] == [ids for _, ids in fresh]
