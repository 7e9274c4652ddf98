"""SDK fallbacks for real: server restart, a disagreeing client tokenizer, strict refusals, a server without Leyline."""

from __future__ import annotations

import copy
import time

import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from openai.types.chat.completion_create_params import CompletionCreateParamsBase

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, HFChatTokenizer, SpliceFallbackError
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from tests.e2e.server_helpers import free_port, make_service, running_server


async def test_server_restart_mid_conversation_falls_back_and_continues():
    port = free_port()
    client = AsyncLeyline(base_url=f"http://127.0.0.1:{port}/v1", policies=[TruncateOlderThanN(2)], max_retries=3)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    with running_server(make_service(kv_budget_mb=32), port=port):
        for turn in range(5):
            await session.create(model="tiny-mla", messages=messages, max_tokens=2)
            messages += agent_turn(turn)
    first_id = session.session_id
    with running_server(make_service(kv_budget_mb=32), port=port):  # a new process: sessions gone
        r = await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        assert session.stats[-1].fallback == "base_mismatch" and session.last_directives
        assert r.leyline["session_id"] != first_id and r.choices[0].message is not None
        messages += agent_turn(5)
        await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        assert session.stats[-1].fallback is None  # back on the fast path
        messages += agent_turn(6)
        await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        assert session.stats[-1].fallback is None and session.stats[-1].rotated_tokens > 0
    await client.aclose()


def disagreeing_tokenizer():
    tok = copy.deepcopy(load_tiny_tokenizer())
    tok.chat_template = tok.chat_template.replace(
        "<|im_start|>{{ message['role'] }}\n", "<|im_start|>{{ message['role'] }}:\n"
    )
    return HFChatTokenizer(tok)


async def test_client_tokenizer_that_disagrees_sends_no_directives():
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)], tokenizer=disagreeing_tokenizer())
        session = client.session(tools=TOOLS)
        messages = [SYSTEM, TASK]
        for turn in range(5):
            r = await session.create(model="tiny-mla", messages=messages, max_tokens=2)
            assert r.choices
            messages += agent_turn(turn)
        assert session.stats[0].fallback == "tokenizer_mismatch"
        assert all(s.fallback in ("tokenizer_mismatch", "base_mismatch") for s in session.stats[1:])
        assert all(s.directives == 0 for s in session.stats)  # never a directive computed on the wrong tokens
        strict = AsyncLeyline(base_url=url + "/v1", tokenizer=disagreeing_tokenizer(), strict=True).session(tools=TOOLS)
        await strict.create(model="tiny-mla", messages=[SYSTEM, TASK], max_tokens=1)
        with pytest.raises(SpliceFallbackError):
            await strict.create(model="tiny-mla", messages=[SYSTEM, TASK, *agent_turn(0)], max_tokens=1)
        await client.aclose()


async def test_a_strict_base_mismatch_is_a_splice_fallback_at_once_and_the_next_turn_starts_over():
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)], strict=True)
        session = client.session(tools=TOOLS)
        messages = [SYSTEM, TASK, *agent_turn(0)]
        await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        refused_id = session.session_id
        session.server.base_digest = "sha256:" + "0" * 64  # the server will not recognise the base we send
        started = time.monotonic()
        with pytest.raises(SpliceFallbackError) as info:
            await session.create(model="tiny-mla", messages=messages + agent_turn(1), max_tokens=2)
        assert info.value.code == "base_mismatch" and isinstance(info.value.__cause__, openai.ConflictError)
        assert info.value.__cause__.response.headers["x-should-retry"] == "false"
        assert time.monotonic() - started < 5  # answered, not retried six times with backoff
        await session.create(model="tiny-mla", messages=messages + agent_turn(1), max_tokens=2)  # starts over
        assert session.session_id != refused_id and session.stats[-1].fallback is None
        with pytest.raises(openai.NotFoundError):  # the refused session was deleted
            await client.get(f"/leyline/sessions/{refused_id}", cast_to=object)
        await session.create(model="tiny-mla", messages=messages + agent_turn(1) + agent_turn(2), max_tokens=2)
        assert session.stats[-1].fallback is None and session.stats[-1].directives > 0
        await client.close()


OPENAI_FIELDS = set(CompletionCreateParamsBase.__annotations__) | {"stream"}


def plain_openai_server(received: list) -> FastAPI:
    """A minimal OpenAI-compatible server without Leyline: echoes, records what it got, and refuses
    (400) any body field openai's own request type does not have, as strict servers do."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        received.append(body)
        unknown = sorted(set(body) - OPENAI_FIELDS)
        if unknown:
            error = {"type": "invalid_request_error", "code": None, "message": f"unknown {unknown}", "param": None}
            return JSONResponse({"error": error}, 400)
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"{len(body['messages'])} messages"},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    return app


async def test_non_leyline_server_still_works_with_policies():
    received: list = []
    with running_server(plain_openai_server(received)) as url:
        client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)])
        messages = [SYSTEM, TASK]
        for turn in range(6):
            r = await client.chat.completions.create(
                model="any",
                messages=messages,
                tools=TOOLS,
                extra_headers={"X-Trace": "1"},
                extra_query={"trace": "1"},
                timeout=30,
                temperature=openai.NOT_GIVEN,
                stop=openai.omit,
            )
            assert r.choices[0].message.content == f"{len(messages)} messages"
            messages += agent_turn(turn)
        stream = await client.chat.completions.create(model="any", messages=messages, stream=True)
        assert isinstance(stream, openai.AsyncStream)
        await stream.close()
        await client.aclose()
    assert all("leyline" not in body for body in received)  # nothing extra sent
    last = received[-1]["messages"]
    assert last[3]["content"].startswith("[evicted: read_file")  # policies shortened the context
    assert len(client.sessions) == 1  # the drop-in found its session by message prefix every turn
