"""AsyncLeyline: argument checks, bounded sessions, closing, and Leyline's routes on openai's retries and errors."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from examples.trace import SYSTEM, TASK
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
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


def flaky_server(calls: list) -> FastAPI:
    """A Leyline-shaped server whose routes fail as the last user message (or the path) says."""
    app = FastAPI()

    def error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
        body = {"error": {"type": "x", "code": code, "message": message, "param": None}}
        return JSONResponse(body, status, headers={"x-request-id": f"req-{len(calls)}", **headers})

    @app.post("/v1/leyline/tokenize")
    async def tokenize(request: Request):
        calls.append((time.monotonic(), "tokenize"))
        if sum(1 for _, what in calls if what == "tokenize") < 3:  # two 503s, then the answer
            return error(503, "busy", "warming up")
        return {"tokens": [1, 2], "message_spans": [{"start": 0, "end": 2}], "prefix_stable": True}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        calls.append((time.monotonic(), "chat"))
        body = await request.json()
        mode = body["messages"][-1]["content"]
        chats = sum(1 for _, what in calls if what == "chat")
        if mode == "bad":
            return error(400, "x", "no")
        if mode == "429" and chats < 2:
            return error(429, "rate", "slow down", **{"Retry-After": "0.3"})
        if mode == "always429":
            return error(429, "rate", "no", **{"Retry-After": "0.05"})
        if mode == "500" and chats < 3:
            return error(503, "boom", "try again")
        if mode == "always500":
            return error(500, "boom", "down")
        choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}

    return app


@pytest.mark.parametrize(
    "mode, error, chats",
    [
        ("429", None, 2),
        ("500", None, 3),
        ("bad", openai.BadRequestError, 1),
        ("always500", openai.InternalServerError, 3),
        ("always429", openai.RateLimitError, 3),
    ],
)
async def test_leyline_routes_and_chat_share_openais_retries_and_errors(mode, error, chats):
    calls: list = []
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=flaky_server(calls)))
    client = AsyncLeyline(base_url="http://flaky/v1", max_retries=2, http_client=http)
    messages = [{"role": "user", "content": mode}]
    if error is None:
        r = await client.chat.completions.create(model="m", messages=messages)
        assert r.choices[0].message.content == "ok"
    else:
        with pytest.raises(error) as info:
            await client.chat.completions.create(model="m", messages=messages)
        assert info.value.code in ("x", "boom", "rate") and info.value.request_id.startswith("req-")
        assert info.value.message.startswith(f"Error code: {info.value.status_code}")
    assert [what for _, what in calls].count("tokenize") == 3  # the probe, retried like any call
    assert [what for _, what in calls].count("chat") == chats
    if mode == "429":
        chat_times = [t for t, what in calls if what == "chat"]
        assert chat_times[1] - chat_times[0] >= 0.25  # Retry-After honoured
    await client.close()


async def test_connection_errors_are_openais_after_retries():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = AsyncLeyline(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    started = time.monotonic()
    with pytest.raises(openai.APIConnectionError) as info:
        await client.chat.completions.create(model="m", messages=[SYSTEM])
    assert str(info.value.request.url).endswith("/v1/leyline/tokenize")  # the probe is the first call
    assert time.monotonic() - started >= 0.3  # one backoff (0.5 s nominal, minus up to 25 % jitter)
    await client.close()


async def test_copies_keep_leylines_arguments_and_share_sessions_with_the_same_server(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat, policies=[TruncateOlderThanN(2)], max_sessions=3, seam_repair=2)
    quick = client.with_options(timeout=5.0)
    assert (quick.policies, quick.tokenizer, quick.max_sessions, quick.seam_repair) == (
        client.policies,
        chat,
        3,
        2,
    )
    assert isinstance(quick, AsyncLeyline) and quick.timeout == 5.0 and not quick.strict
    messages = [SYSTEM, TASK]
    await client.chat.completions.create(model="m", messages=messages)
    await quick.chat.completions.create(model="m", messages=[*messages, {"role": "user", "content": "more"}])
    assert quick.sessions == client.sessions and len(client.sessions) == 1  # one conversation, one session
    assert fake.chats[-1].spliced is not None  # continued through the copy
    strict = client.copy(strict=True)
    assert strict.strict and strict.session().strict and strict.policies == client.policies
    elsewhere = client.with_options(base_url="http://other/v1")
    assert elsewhere.sessions == [] and client.sessions  # another server: sessions of its own
    with pytest.raises(ValueError, match="seam_repair"):
        client.with_options(seam_repair=-1)
    await client.close()
