"""AsyncLeyline / Leyline against real servers: streaming, sync facade, retries, typed errors."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Leyline
from leyline_sdk.errors import APIConnectionError, BadRequestError, InternalServerError, RateLimitError
from tests.e2e.server_helpers import free_port, make_service, running_server


@pytest.fixture(scope="module")
def server():
    with running_server(make_service(kv_budget_mb=32)) as url:
        yield url


async def test_streaming_through_a_session_records_stats(server):
    client = AsyncLeyline(base_url=server + "/v1", policies=[TruncateOlderThanN(2)])
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(5):
        stream = await session.create(model="tiny-mla", messages=messages, max_tokens=3, stream=True)
        chunks = [c async for c in stream]
        assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
        assert chunks[-1].choices[0].finish_reason is not None
        messages += agent_turn(turn)
    assert session.stats[-1].rotated_tokens > 0 and session.stats[-1].fallback is None
    await client.aclose()


async def test_apply_edits_splices_while_a_tool_runs(server):
    client = AsyncLeyline(base_url=server + "/v1", policies=[TruncateOlderThanN(2)])
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(3):
        await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        messages += agent_turn(turn)
    session.history = list(messages)  # the agent appended its turn; the tool is still running
    stats = await session.apply_edits()
    assert stats is not None and stats.directives >= 1 and stats.rotated_tokens > 0 and stats.fallback is None
    await session.create(model="tiny-mla", messages=messages, max_tokens=2)
    assert session.stats[-1].fallback is None
    await client.aclose()


def test_sync_facade(server):
    client = Leyline(base_url=server + "/v1", policies=[TruncateOlderThanN(2)])
    r = client.chat.completions.create(model="tiny-mla", messages=[SYSTEM, TASK], max_tokens=2)
    assert isinstance(r, ChatCompletion) and r.leyline["session_id"]
    chunks = list(client.chat.completions.create(model="tiny-mla", messages=[SYSTEM, TASK], max_tokens=2, stream=True))
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
    client.close()


def flaky_server(calls: list) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        calls.append((time.monotonic(), request.headers.get("idempotency-key")))
        body = await request.json()
        mode = body["messages"][-1]["content"]
        if mode == "bad":
            return JSONResponse({"error": {"type": "invalid_request_error", "code": "x", "message": "no"}}, 400)
        if mode == "429" and len(calls) < 2:
            return JSONResponse(
                {"error": {"code": "rate", "message": "slow down"}}, 429, headers={"Retry-After": "0.3"}
            )
        if mode == "500" and len(calls) < 3:
            return JSONResponse({"error": {"code": "boom", "message": "try again"}}, 503)
        if mode == "always500":
            return JSONResponse({"error": {"code": "boom", "message": "down"}}, 500)
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        }

    return app


@pytest.mark.parametrize("mode, attempts", [("429", 2), ("500", 3), ("bad", 1), ("always500", 3)])
async def test_retries_follow_the_rules(mode, attempts):
    calls: list = []
    with running_server(flaky_server(calls)) as url:
        client = AsyncLeyline(base_url=url + "/v1", max_retries=2)
        client._leyline = False  # a plain server; skip the probe so the call count is exact
        messages = [{"role": "user", "content": mode}]
        if mode == "bad":
            with pytest.raises(BadRequestError) as info:
                await client.chat.completions.create(model="m", messages=messages)
            assert info.value.status_code == 400 and info.value.code == "x"
        elif mode == "always500":
            with pytest.raises(InternalServerError):
                await client.chat.completions.create(model="m", messages=messages)
        else:
            r = await client.chat.completions.create(model="m", messages=messages)
            assert r.choices[0].message.content == "ok"
        await client.aclose()
    assert len(calls) == attempts
    assert len({key for _, key in calls}) == 1  # one idempotency key across retries
    if mode == "429":
        assert calls[1][0] - calls[0][0] >= 0.25  # Retry-After honoured


async def test_connection_errors_are_typed_after_retries():
    client = AsyncLeyline(base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1)
    with pytest.raises(APIConnectionError):
        await client.chat.completions.create(model="m", messages=[SYSTEM])
    assert issubclass(RateLimitError, Exception)
    await client.aclose()
