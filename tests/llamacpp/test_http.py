"""The real server on the llama.cpp engine, driven over HTTP by the openai client and the SDK.

The same HTTP surface, sessions, ``leyline`` fields and fallback codes as the embedded engine;
``tiny-gqa`` is the same model on both engines, so their answers must agree token for token.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from leyline_sdk.core.directives import Directive, apply, digest
from leyline_server.local import local_service, serve_in_thread

pytestmark = pytest.mark.slow
MODEL = "tiny-gqa"
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the file."},
    {"role": "tool", "tool_call_id": "c1", "content": "def main():\n    return 1\n" * 20},
    {"role": "user", "content": "Now fix it."},
]


@pytest.fixture(scope="module")
def server():
    # float32 KV: the same numbers as the embedded engine (float16, llama.cpp's default, rounds them)
    service = local_service(
        MODEL, engine="llamacpp", kv_cache_dtype="float32", max_directives=4, max_replacement_tokens=50
    )
    assert service.engine.info.engine == "llamacpp"
    with serve_in_thread(service) as url:
        yield url


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def error_of(response, status, code):
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["message"]
    return body


async def _conversation(url: str) -> list:
    """A plain request, a session turn, a spliced turn (tool output evicted) and a stream."""
    c = client(url)
    out = []
    first = await c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"leyline": {}}
    )
    out.append((first.leyline["completion_token_ids"], first.usage.prompt_tokens))
    ext = first.leyline
    async with httpx.AsyncClient(base_url=url) as http:
        old = (await http.post("/v1/leyline/tokenize", json={"messages": MESSAGES})).json()
        edited = [dict(m) for m in MESSAGES]
        edited[2]["content"] = "[evicted: 40 lines]"
        new = (await http.post("/v1/leyline/tokenize", json={"messages": edited})).json()
    span, new_span = old["message_spans"][2], new["message_spans"][2]
    directive = Directive(
        start=span["start"], end=span["end"], replacement=new["tokens"][new_span["start"] : new_span["end"]]
    )
    follow = edited + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    async with httpx.AsyncClient(base_url=url) as http:
        prompt2 = (await http.post("/v1/leyline/tokenize", json={"messages": follow})).json()["tokens"]
    base = old["tokens"] + ext["completion_token_ids"]
    spliced = apply(base, [directive])
    cut = next(i for i, (a, b) in enumerate(zip(spliced, prompt2, strict=False)) if a != b)
    tail = Directive(start=cut - directive.delta, end=len(base), replacement=prompt2[cut:])
    directives = [directive.model_dump(mode="json"), tail.model_dump(mode="json")]
    second = await c.chat.completions.create(
        model=MODEL,
        messages=follow,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={
            "leyline": {
                "session_id": ext["session_id"],
                "base": ext["base"],
                "directives": directives,
            }
        },
    )
    r = second.leyline
    assert r["applied"] and r["rotated_tokens"] > 0 and r["canary"] == "passed", r
    out.append((r["completion_token_ids"], r["reused_tokens"], r["rotated_tokens"], r["prefilled_tokens"]))
    out.append([round(t.logprob, 3) for t in second.choices[0].logprobs.content])
    stream = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, stream=True)
    out.append("".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]))
    return out


async def test_same_answers_as_the_embedded_engine(server):
    mine = await _conversation(server)
    with serve_in_thread(local_service(MODEL, engine="embedded")) as url:
        theirs = await _conversation(url)
    assert mine == theirs


async def test_sixteen_concurrent_sessions_edit_independently(server):
    rng = random.Random(0)

    async def one(i):
        async with httpx.AsyncClient(base_url=server, timeout=60) as c:
            tokens = [rng.randint(7, 1000) for _ in range(rng.randint(20, 60))]
            sid = (await c.post("/v1/leyline/sessions", json={"tokens": tokens})).json()["id"]
            expected = tokens
            for _ in range(6):
                n = len(expected)
                a = rng.randint(0, n)
                b = rng.randint(a, min(n, a + 10))
                replacement = [rng.randint(7, 1000) for _ in range(rng.randint(0, 5))]
                d = Directive(start=a, end=b, replacement=replacement, mode=rng.choice(["amortize", "forget"]))
                body = {
                    "base": {"length": n, "digest": digest(expected)},
                    "directives": [d.model_dump(mode="json")],
                    "strict": True,
                }
                r = await c.post(f"/v1/leyline/sessions/{sid}/directives", json=body)
                assert r.status_code == 200, r.text
                expected = apply(expected, [d])
                assert r.json()["base"] == {"length": len(expected), "digest": digest(expected)}
            return sid, expected

    results = await asyncio.gather(*(one(i) for i in range(16)))
    async with httpx.AsyncClient(base_url=server) as c:
        for sid, expected in results:
            assert (await c.get(f"/v1/leyline/sessions/{sid}")).json()["tokens"] == expected


async def test_bad_input_and_fallback_codes(server):
    async with httpx.AsyncClient(base_url=server, timeout=60) as c:
        sid = (await c.post("/v1/leyline/sessions", json={"tokens": list(range(10, 40))})).json()["id"]
        url = f"/v1/leyline/sessions/{sid}/directives"
        one = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        error_of(await c.post("/v1/chat/completions", json={**one, "n": 2}), 400, "unsupported_parameter")
        error_of(await c.post("/v1/chat/completions", json={**one, "max_tokens": 5000}), 400, "context_length_exceeded")
        error_of(await c.post("/v1/leyline/sessions", json={"tokens": [10**6]}), 400, "token_invalid")
        strict = {"strict": True}
        error_of(
            await c.post(url, json={**strict, "base": {"length": 3}, "directives": [{"start": 0, "end": 1}]}),
            409,
            "base_mismatch",
        )
        error_of(await c.post(url, json={**strict, "directives": [{"start": 0, "end": 99}]}), 422, "span_invalid")
        bad_token = {"start": 0, "end": 1, "replacement": [5000]}
        error_of(await c.post(url, json={**strict, "directives": [bad_token]}), 422, "token_invalid")
        r = (await c.post(url, json={"directives": [{"start": 0, "end": 99}]})).json()
        assert r["applied"] is False and r["fallback"]["code"] == "span_invalid" and r["base"]["length"] == 30
        r = (await c.post(url, json={"directives": [{"start": 2, "end": 5, "replacement": [7]}]})).json()
        assert r["applied"] and r["rotated_tokens"] == 25 and r["canary"] == "passed"
        error_of(await c.get("/v1/leyline/sessions/nope"), 404, "session_not_found")
    ghost = await client(server).chat.completions.create(
        **one, max_tokens=2, extra_body={"leyline": {"session_id": "gone", "directives": [{"start": 0, "end": 1}]}}
    )
    assert ghost.leyline["fallback"]["code"] == "base_mismatch" and ghost.leyline["session_id"] != "gone"


async def _fill_then_ask(service, inspect=None):
    """Open idle sessions until the 256-cell pool is full, ask for half the pool, then ``inspect(ids)``
    while the server still runs; (session ids, their GET status codes)."""
    capacity = service.engine.info.kv_capacity_tokens
    assert capacity == 256
    with serve_in_thread(service) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            sessions = []
            for i in range(capacity // 40):
                r = await c.post("/v1/leyline/sessions", json={"tokens": [10 + i] + list(range(100, 138))})
                assert r.status_code == 200, r.text
                sessions.append(r.json()["id"])
            words = 1
            while len(service.chat.render([{"role": "user", "content": "word " * words}]).tokens) < capacity // 2:
                words += 1
            big = [{"role": "user", "content": "word " * words}]
            ok = await client(url).chat.completions.create(model=MODEL, messages=big, max_tokens=2)
            assert ok.choices  # served
            status = [(await c.get(f"/v1/leyline/sessions/{s}")).status_code for s in sessions]
            if inspect is not None:
                await service.engine.scheduler.call(inspect, sessions)
            return sessions, status


async def test_a_pool_full_of_idle_sessions_parks_them_and_loses_none():
    service = local_service(MODEL, layers=1, engine="llamacpp", kv_budget_mb=0.01)  # the minimum: 256 cells
    core = service.engine.core
    seen = {}

    def inspect(ids):  # on the engine thread, while serving
        handles = [service.sessions.get(s, None).handle for s in ids]
        seen["parked"] = sum(not h.entry.resident for h in handles)
        seen["bytes"] = core.cache.parked_bytes
        for h in handles:
            core.check(h)  # parked or not, each holds exactly what its handle says

    sessions, status = await _fill_then_ask(service, inspect)
    assert status == [200] * len(sessions)  # every session kept its cache, parked in host memory
    assert seen["parked"] > 0 and seen["bytes"] > 0


async def test_without_swap_space_the_oldest_idle_sessions_are_dropped():
    service = local_service(MODEL, layers=1, engine="llamacpp", kv_budget_mb=0.01, swap_space_gb=0)
    sessions, status = await _fill_then_ask(service)
    assert status[0] == 404 and status[-1] == 200


async def test_sdk_session_with_a_policy_splices(server):
    sdk = AsyncLeyline(base_url=server + "/v1", policies=[TruncateOlderThanN(2)])
    session = sdk.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(6):
        r = await session.create(model=MODEL, messages=messages, max_tokens=2)
        assert r.choices
        messages += agent_turn(turn)
    assert all(s.fallback is None for s in session.stats)
    assert sum(s.rotated_tokens for s in session.stats) > 0
    await sdk.aclose()
