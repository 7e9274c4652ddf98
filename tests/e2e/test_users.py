"""What a real user hits: approximate KV only for who asked, key isolation, sessions that never lock
anyone out, unknown sessions, strict bases, abandoned streams, unexpected errors."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from tests.e2e.server_helpers import make_service, running_server

KEY_A, KEY_B = "sk-alpha", "sk-beta"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def conversation(turns: int) -> list[dict]:
    """A tool-heavy conversation: each turn reads a file (a long output) and answers."""
    messages: list[dict] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix app.py"}]
    for t in range(turns):
        call = {
            "id": f"c{t}",
            "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "f{t}.py"}}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"line {t} of the file\n" * 25})
    messages.append({"role": "user", "content": "What is wrong?"})
    return messages


async def spliced_session(url: str, key: str) -> tuple[list[dict], dict]:
    """Run a session until a turn is really spliced; return that turn's effective messages and stats."""
    async with AsyncLeyline(base_url=url + "/v1", api_key=key, policies=[TruncateOlderThanN(1)]) as client:
        session = client.session(tools=TOOLS)
        messages = conversation(2)
        for turn in range(2):
            r = await session.create(model="tiny-mla", messages=messages, max_tokens=2, temperature=0)
            messages = [*messages, {"role": "assistant", "content": r.choices[0].message.content or ""}]
            messages += conversation(turn + 3)[-3:]  # one more tool call, its output, a question
        stats = session.stats[-1]
        assert stats.rotated_tokens > 0 and stats.fallback is None, stats
        assert stats.approximate_tokens > 0
        return list(session.effective), stats.model_dump()


async def plain(url: str, key: str, messages: list[dict]) -> openai.types.chat.ChatCompletion:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    return await client.chat.completions.create(
        model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=12, temperature=0
    )


async def fresh_answer(messages: list[dict]) -> list[int]:
    """The oracle: a server that never saw anything answers the same request."""
    with running_server(make_service(layers=4, kv_budget_mb=16)) as url:
        response = await plain(url, "x", messages)
    return response.leyline["completion_token_ids"]


async def test_a_plain_request_after_a_splice_gets_exactly_a_fresh_prefill():
    with running_server(make_service(layers=4, kv_budget_mb=16)) as url:
        effective, _ = await spliced_session(url, "x")
        response = await plain(url, "x", effective)
    ext = response.leyline
    assert ext["approximate_tokens"] == 0 and ext["session_id"] is None
    assert ext["completion_token_ids"] == await fresh_answer(effective)


async def test_another_key_never_reuses_a_sessions_spliced_path():
    service = make_service(layers=4, kv_budget_mb=16, api_keys=frozenset({KEY_A, KEY_B}), isolate_keys=False)
    with running_server(service) as url:
        effective, stats = await spliced_session(url, KEY_A)
        response = await plain(url, KEY_B, effective)
    ext = response.leyline
    assert ext["approximate_tokens"] == 0
    # only the exact prefix before the first rotated token is shared
    assert response.usage.prompt_tokens_details.cached_tokens <= stats["prompt_tokens"] - stats["rotated_tokens"]
    assert ext["completion_token_ids"] == await fresh_answer(effective)


async def test_with_key_isolation_another_keys_identical_prompt_is_not_cached():
    service = make_service(api_keys=frozenset({KEY_A, KEY_B}))  # isolation is on by default with keys
    messages = conversation(2)
    with running_server(service) as url:
        first = await plain(url, KEY_A, messages)
        again = await plain(url, KEY_A, messages)
        other = await plain(url, KEY_B, messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the same key hits its own cache
    assert other.usage.prompt_tokens_details.cached_tokens == 0


async def test_unknown_sessions_and_strict_bases():
    with running_server(make_service()) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        r = await client.chat.completions.create(
            model="tiny-mla", messages=messages, max_tokens=2, extra_body={"leyline": {"session_id": "gone"}}
        )
        ext = r.leyline
        assert ext["fallback"]["code"] == "base_mismatch" and "'gone'" in ext["fallback"]["message"]
        assert ext["session_id"] and ext["session_id"] != "gone" and r.choices[0].message.content is not None
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="tiny-mla",
                messages=messages,
                max_tokens=2,
                extra_body={"leyline": {"session_id": "gone", "strict": True}},
            )
        wrong = {"session_id": ext["session_id"], "base": {"length": 3, "digest": "sha256:00"}, "strict": True}
        with pytest.raises(openai.ConflictError):  # a base is checked whenever one is sent
            await client.chat.completions.create(
                model="tiny-mla", messages=messages, max_tokens=2, extra_body={"leyline": wrong}
            )
        r = await client.chat.completions.create(
            model="tiny-mla", messages=messages, max_tokens=2, extra_body={"leyline": {**wrong, "strict": False}}
        )
        assert r.leyline["fallback"]["code"] == "base_mismatch" and r.leyline["session_id"] == ext["session_id"]


async def test_a_thousand_sessions_on_one_key_are_never_refused():
    service = make_service(layers=1, max_sessions_per_key=64, api_keys=frozenset({KEY_A}))
    with running_server(service) as url:
        async with AsyncLeyline(base_url=url + "/v1", api_key=KEY_A, max_sessions=600) as sdk:
            first = sdk.session()
            await first.create(model="tiny-mla", messages=[{"role": "user", "content": "first"}], max_tokens=1)
            plain_client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0)
            for i in range(500):
                s = sdk.session()
                await s.create(model="tiny-mla", messages=[{"role": "user", "content": f"sdk {i}"}], max_tokens=1)
                r = await plain_client.chat.completions.create(
                    model="tiny-mla",
                    messages=[{"role": "user", "content": f"plain {i}"}],
                    max_tokens=1,
                    extra_body={"leyline": {}},
                )
                assert r.leyline["session_id"]
            # (a session in use is never dropped: tests/server/test_sessions.py holds one through a flood)
            # the first session was dropped long ago: its next turn falls back and loses nothing
            r = await first.create(
                model="tiny-mla",
                messages=[{"role": "user", "content": "first"}, {"role": "user", "content": "more"}],
                max_tokens=2,
            )
            assert r.leyline["fallback"]["code"] == "base_mismatch"
            assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
            assert first.stats[-1].fallback == "base_mismatch"
    assert len(service.sessions) <= 64


async def test_an_abandoned_stream_leaves_the_session_usable():
    with running_server(make_service()) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        r = await client.chat.completions.create(
            model="tiny-mla", messages=messages, max_tokens=2, extra_body={"leyline": {}}
        )
        sid = r.leyline["session_id"]
        body = {
            "model": "tiny-mla",
            "messages": messages,
            "max_tokens": 50,
            "stream": True,
            "leyline": {"session_id": sid},
        }
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200  # ...and the client leaves without reading
        again = await asyncio.wait_for(
            client.chat.completions.create(
                model="tiny-mla", messages=messages, max_tokens=2, extra_body={"leyline": {"session_id": sid}}
            ),
            timeout=30,
        )
        assert again.leyline["session_id"] == sid and again.leyline["fallback"] is None


async def test_an_unexpected_error_is_openai_shaped_and_the_server_keeps_serving():
    service = make_service()
    real = service.engine.start_turn

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    with running_server(service) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            body = {"model": "tiny-mla", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            service.engine.start_turn = broken
            r = await http.post("/v1/chat/completions", json=body)
            assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
            error = r.json()["error"]
            assert error["code"] == "internal_error" and r.headers["x-request-id"] in error["message"]
            service.engine.start_turn = real
            r = await http.post("/v1/chat/completions", json=body)  # same kept-alive connection
            assert r.status_code == 200
