"""The same agent code, once with openai's client and once with Leyline's: every idiom behaves the same.

The oracle is openai-python itself: ``agent`` (async) and ``sync_agent`` exercise the idioms code
written for openai relies on — exceptions caught by openai's classes, ``with_options``, raw and
streamed responses, stream context managers, ``omit`` / ``NOT_GIVEN``, ``extra_*`` and
``timeout``, ``models``, ``_request_id``, the environment variables — and record what they
observe (types, statuses, error attributes; never generated text). The record of
``openai.AsyncOpenAI`` must equal ``AsyncLeyline``'s (and ``openai.OpenAI``'s ``Leyline``'s),
and a few absolute checks keep both honest. Leyline's sessions must have recorded every turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Leyline
from leyline_server.local import free_port
from tests.frameworks.conftest import KEY, MODEL


def shape(value: Any) -> Any:
    """What an idiom returned, without generated text: its type, and a response's status."""
    return type(value).__name__


async def agent(client: openai.AsyncOpenAI, dead_url: str) -> dict[str, Any]:
    """An agent written for openai; returns what it observed."""
    seen: dict[str, Any] = {"client_is_openai": isinstance(client, openai.AsyncOpenAI)}
    messages = [SYSTEM, TASK]
    r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4)
    seen["create"] = (shape(r), r.object, r._request_id.startswith("req-"), r.usage.prompt_tokens > 0)
    messages += agent_turn(0)

    quick = client.with_options(timeout=30.0, max_retries=1)
    seen["with_options"] = (type(quick) is type(client), quick.timeout, quick.max_retries)  # defaults differ: see below
    r = await quick.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, temperature=openai.NOT_GIVEN, stop=openai.omit
    )
    seen["with_options_create"] = shape(r)
    messages += agent_turn(1)

    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, extra_headers={"X-Trace": "1"}
    )
    parsed = raw.parse()
    seen["raw"] = (raw.status_code, raw.http_request.method, raw.retries_taken, shape(parsed), parsed is raw.parse())
    seen["raw_request_id"] = raw.request_id == parsed._request_id
    messages += agent_turn(2)

    async with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, extra_query={"trace": "1"}, timeout=60
    ) as response:
        seen["streaming_response"] = (response.status_code, shape(await response.parse()))
    messages += agent_turn(3)

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"seed": 7},
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    seen["stream"] = (shape(stream), stream.response.status_code, shape(chunks[0]), chunks[-1].usage is not None)
    seen["stream_closed"] = stream.response.is_closed
    messages += agent_turn(4)

    early = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, stream=True)
    await early.close()  # the agent gave up on this stream: the next call still works
    seen["early_close"] = early.response.is_closed
    r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4)
    seen["after_early_close"] = shape(r)

    seen["errors"] = await errors(client, messages, dead_url)
    seen["models"] = [m.id async for m in client.models.list()]
    return seen


async def errors(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], dead_url: str) -> list[Any]:
    """Each refusal, as openai's exception classes catch it."""
    out: list[Any] = []
    for kwargs in ({"model": "no-such-model"}, {"model": MODEL, "n": 2}):
        try:
            await client.chat.completions.create(messages=messages, max_tokens=2, **kwargs)
        except openai.APIStatusError as exc:
            out.append((type(exc).__name__, exc.status_code, exc.code, exc.param, exc.request_id is not None))
    try:
        await client.with_options(base_url=dead_url, max_retries=0).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2
        )
    except openai.APIConnectionError as exc:
        out.append(type(exc).__name__)
    try:
        await client.with_options(api_key="wrong").chat.completions.create(model=MODEL, messages=messages)
    except openai.AuthenticationError as exc:
        out.append((type(exc).__name__, exc.status_code))
    return out


def sync_agent(client: openai.OpenAI) -> dict[str, Any]:
    """The blocking twin of ``agent`` (fewer idioms: the same code paths)."""
    seen: dict[str, Any] = {"client_is_openai": isinstance(client, openai.OpenAI)}
    messages = [SYSTEM, TASK]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4)
    seen["create"] = (shape(r), r._request_id.startswith("req-"))
    messages += agent_turn(0)
    raw = client.with_options(timeout=30).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4
    )
    seen["raw"] = (raw.status_code, shape(raw.parse()))
    messages += agent_turn(1)
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4
    ) as response:
        seen["streaming_response"] = (response.status_code, shape(response.parse()))
    messages += agent_turn(2)
    with client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, stream=True) as s:
        chunks = list(s)
    seen["stream"] = (shape(s), shape(chunks[0]), s.response.is_closed)
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    except openai.NotFoundError as exc:
        seen["error"] = (exc.status_code, exc.code)
    seen["models"] = [m.id for m in client.models.list()]
    return seen


EXPECTED_ERRORS = [
    ("NotFoundError", 404, "model_not_found", "model", True),
    ("BadRequestError", 400, "unsupported_parameter", "n", True),
    "APIConnectionError",
    ("AuthenticationError", 401),
]


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


async def test_the_same_agent_behaves_the_same_with_openai_and_leyline(server, dead_url):
    plain = openai.AsyncOpenAI(base_url=server, api_key=KEY)
    leyline = AsyncLeyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    with_openai = await agent(plain, dead_url)
    with_leyline = await agent(leyline, dead_url)
    assert with_leyline == with_openai
    assert with_openai["create"] == ("ChatCompletion", "chat.completion", True, True)
    assert with_openai["raw"] == (200, "POST", 0, "ChatCompletion", True)
    assert with_openai["stream"] == ("AsyncStream", 200, "ChatCompletionChunk", True)
    assert with_openai["errors"] == EXPECTED_ERRORS and with_openai["models"] == [MODEL]
    assert with_openai["with_options"] == (True, 30.0, 1)
    # Leyline's session saw every turn of the conversation, whichever way it was read (6; the
    # stream closed unread is no turn), and the turn after the abandoned stream spliced anyway
    (session,) = [s for s in leyline.sessions if len(s.history) >= 12]
    assert len(session.stats) == 6 and session.stats[-1].fallback is None
    assert sum(s.rotated_tokens for s in session.stats) > 0 and sum(s.cleared for s in session.stats) >= 2
    await plain.close()
    await leyline.close()


def test_the_same_blocking_agent_behaves_the_same_with_openai_and_leyline(server):
    plain = openai.OpenAI(base_url=server, api_key=KEY)
    leyline = Leyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    with_openai, with_leyline = sync_agent(plain), sync_agent(leyline)
    assert with_leyline == with_openai
    assert with_openai["stream"] == ("Stream", "ChatCompletionChunk", True)
    assert with_openai["error"] == (404, "model_not_found")
    (session,) = leyline.sessions
    assert len(session.stats) == 4 and all(s.fallback is None for s in session.stats)
    assert session.stats[-1].directives > 0
    plain.close()
    leyline.close()


@pytest.mark.parametrize("make", [openai.AsyncOpenAI, AsyncLeyline], ids=["openai", "leyline"])
async def test_environment_variables_configure_both_clients(server, monkeypatch, make: Callable[..., Any]):
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    client = make()
    assert str(client.base_url) == server + "/" and client.api_key == KEY
    r = await client.chat.completions.create(model=MODEL, messages=[SYSTEM, TASK], max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    with pytest.raises(openai.AuthenticationError):
        await make().chat.completions.create(model=MODEL, messages=[SYSTEM, TASK], max_tokens=2)
    await client.close()


def test_what_differs_from_openai_on_purpose(monkeypatch):
    """Leyline's defaults: a local server, no key required, retries that ride over a restart."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(openai.OpenAIError):
        openai.AsyncOpenAI()  # openai insists on a key
    client = AsyncLeyline()
    assert str(client.base_url) == "http://127.0.0.1:8000/v1/" and client.api_key == "" and client.max_retries == 6
    assert "Authorization" not in client.auth_headers
