"""AsyncLeyline / Leyline: argument checks, bounded sessions, closing, sync facade, retries, typed errors."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Leyline
from leyline_sdk.errors import APIConnectionError, BadRequestError, InternalServerError, RateLimitError
from tests.sdk.fake_server import FakeLeyline


def make_client(fake: FakeLeyline, **kwargs) -> AsyncLeyline:
    return AsyncLeyline(base_url="http://fake/v1", http_client=fake.client(), max_retries=0, **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"messages": "hi"}, TypeError, "messages must be a list of message dicts, got str"),
        ({"messages": {"role": "user"}}, TypeError, "messages must be a list"),
        ({"messages": []}, ValueError, "messages must not be empty"),
        ({"messages": ["hi"]}, TypeError, "messages[0] must be a dict"),
        ({"messages": [SYSTEM, {"content": "x"}]}, ValueError, "messages[1] has no 'role'"),
        ({"messages": [{"role": 3, "content": "x"}]}, TypeError, "messages[0]['role'] must be a string"),
        ({"model": None}, TypeError, "model must be a string"),
        ({"model": ""}, ValueError, "model is required"),
        ({"tools": "read_file"}, TypeError, "tools must be a list of tool dicts"),
        ({"tools": ["read_file"]}, TypeError, "tools[0] must be a dict"),
    ],
)
async def test_bad_arguments_raise_clear_errors_before_anything_is_sent(chat, kwargs, error, words):
    fake = FakeLeyline(chat)
    client = make_client(fake)
    args = {"model": "m", "messages": [SYSTEM, TASK], **kwargs}
    with pytest.raises(error) as info:
        await client.chat.completions.create(**args)
    assert words in str(info.value)
    session = client.session()
    with pytest.raises(error):
        await session.create(**args)
    assert fake.requests == []
    await client.aclose()


async def test_sessions_are_bounded_and_forgotten_ones_are_deleted_on_the_server(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat, max_sessions=2)
    conversations = [[SYSTEM, {"role": "user", "content": f"task {i}"}] for i in range(3)]
    for messages in conversations:
        await client.chat.completions.create(model="m", messages=messages)
    ids = list(fake.sessions)  # in creation order
    assert len(client.sessions) == 2 and len(ids) == 3
    first = ids[0]
    # the least recently used (the first) was forgotten; its server session goes at the next call
    await client.chat.completions.create(model="m", messages=conversations[2] + [{"role": "user", "content": "more"}])
    assert fake.deleted == [first] and first not in fake.sessions
    remembered = [s.session_id for s in client.sessions]
    await client.aclose()
    assert sorted(fake.deleted[1:]) == sorted(remembered) and fake.sessions == {}


async def test_close_deletes_sessions_and_ignores_404(chat):
    fake = FakeLeyline(chat)
    async with make_client(fake, tokenizer=chat) as client:
        kept = client.session()
        await kept.create(model="m", messages=[SYSTEM, TASK])
        gone = client.session()
        await gone.create(model="m", messages=[SYSTEM, {"role": "user", "content": "other"}])
        gone_id = gone.session_id
        fake.drop(gone_id)  # already dropped by the server: the 404 is ignored
        await gone.aclose()
        assert gone.session_id is None and gone.base_tokens is None
        kept_id = kept.session_id
    assert fake.deleted == [kept_id] and fake.sessions == {}
    assert kept in client.sessions and kept.session_id is None and kept.stats  # still readable after close
    assert fake.requests.count(("DELETE", f"/v1/leyline/sessions/{gone_id}")) == 1  # not again on exit


async def test_explicit_session_in_use_stays_remembered(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat, max_sessions=2)
    mine = client.session()
    await mine.create(model="m", messages=[SYSTEM, TASK])
    client.session()
    await mine.create(model="m", messages=[SYSTEM, TASK, {"role": "user", "content": "next"}])  # touched
    client.session()  # evicts the idle one, not mine
    assert mine in client.sessions
    await client.aclose()


def test_sync_facade(chat):
    fake = FakeLeyline(chat)
    with Leyline(base_url="http://fake/v1", http_client=fake.client(), policies=[TruncateOlderThanN(2)]) as client:
        messages = [SYSTEM, TASK]
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert isinstance(r, ChatCompletion) and r.leyline["session_id"] in fake.sessions
        messages += agent_turn(0)
        chunks = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
        assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
        session = client.async_client.sessions[0]
        assert session.stats[-1].fallback is None and len(session.stats) == 2  # the same session, spliced
    assert fake.sessions == {}  # closed on exit


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
        if mode == "always429":
            return JSONResponse({"error": {"code": "rate", "message": "no"}}, 429, headers={"Retry-After": "0.05"})
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


@pytest.mark.parametrize("mode, attempts", [("429", 2), ("500", 3), ("bad", 1), ("always500", 3), ("always429", 3)])
async def test_retries_follow_the_rules(mode, attempts):
    calls: list = []
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=flaky_server(calls)))
    client = AsyncLeyline(base_url="http://flaky/v1", max_retries=2, http_client=http)
    client.probe.known = False  # a plain server; skip the probe so the call count is exact
    messages = [{"role": "user", "content": mode}]
    if mode == "bad":
        with pytest.raises(BadRequestError) as info:
            await client.chat.completions.create(model="m", messages=messages)
        assert info.value.status_code == 400 and info.value.code == "x"
    elif mode == "always500":
        with pytest.raises(InternalServerError):
            await client.chat.completions.create(model="m", messages=messages)
    elif mode == "always429":
        with pytest.raises(RateLimitError) as info:
            await client.chat.completions.create(model="m", messages=messages)
        assert info.value.status_code == 429 and info.value.code == "rate" and info.value.retry_after == 0.05
    else:
        r = await client.chat.completions.create(model="m", messages=messages)
        assert r.choices[0].message.content == "ok"
    await client.aclose()
    assert len(calls) == attempts
    assert len({key for _, key in calls}) == 1  # one idempotency key across retries
    if mode == "429":
        assert calls[1][0] - calls[0][0] >= 0.25  # Retry-After honoured


async def test_connection_errors_are_typed_after_retries():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = AsyncLeyline(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    started = time.monotonic()
    with pytest.raises(APIConnectionError) as info:
        await client.chat.completions.create(model="m", messages=[SYSTEM])
    assert "POST /leyline/tokenize" in str(info.value)  # the probe is the first call; it was retried
    assert time.monotonic() - started >= 0.2  # one backoff (>= 0.25 s nominal, minus jitter rounding)
    await client.aclose()
