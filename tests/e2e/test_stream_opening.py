"""Streams open at admission, keep alive while the prompt is prefilled, and report at their end.

A tiny model whose prefill is slowed down (8-token chunks) and a keep-alive every 20 ms, so that
every stream here carries keep-alives between its opening and its answer: the real openai and
anthropic clients must read them as the protocols define (an SSE comment; Anthropic's ``ping``).
A stream's headers carry what is known when it starts (the session, the cap); the token counts
come in its final event's ``leyline`` report, and stay headers on a whole answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from leyline_server.api.config import ServerConfig
from leyline_server.api.service import LeylineService
from leyline_server.engines.factory import EngineConfig, build_engine
from leyline_server.local import serve_in_thread

MODEL = "tiny-gqa"
PROMPT = " ".join(f"item {i} is {i * 7 % 13}." for i in range(300))  # ~2,000 tokens: ~250 chunks
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The tiny model, prefilling 8 tokens a step, a keep-alive every 20 ms."""
    engine, tokenizer = build_engine(EngineConfig(model=MODEL, kv_budget_mb=8.0, chunked_prefill_size=8))
    config = ServerConfig(model_name=MODEL, max_context_tokens=4096, default_max_tokens=8, stream_keepalive_s=0.02)
    with serve_in_thread(LeylineService(engine, tokenizer, config)) as url:
        yield url


def body(protocol: str, text: str, stream: bool, max_tokens: int = 6) -> dict[str, Any]:
    """A greedy request for ``text`` on ``protocol``."""
    if protocol == "responses":
        return {"model": MODEL, "input": text, "max_output_tokens": max_tokens, "stream": stream, "temperature": 0}
    messages = [{"role": "user", "content": text}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream, "temperature": 0}


KEEP_ALIVE = {"chat": ": keep-alive", "responses": "event: response.in_progress", "messages": "event: ping"}


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_stream_keeps_alive_between_its_opening_and_its_answer(server: str, protocol: str) -> None:
    with httpx.stream(
        "POST", server + PATHS[protocol], json=body(protocol, f"A {protocol}. " + PROMPT, True), timeout=60
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    keep_alive = KEEP_ALIVE[protocol]
    first = lines.index(keep_alive, 1 if protocol != "responses" else lines.index(keep_alive) + 1)
    opening = {"chat": 'data: {"id"', "responses": "event: response.created", "messages": "event: message_start"}
    assert lines[0].startswith(opening[protocol]) and first <= 4, lines[:5]  # after the opening events
    assert lines.count(keep_alive) >= 5, lines.count(keep_alive)  # several, before the answer's first event
    if protocol == "messages":  # the ping right after message_start, then one per interval
        assert lines[:4] == ["event: message_start", lines[1], "event: ping", 'data: {"type": "ping"}'], lines[:4]


async def test_the_openai_client_reads_a_chat_stream_with_keep_alives(server: str) -> None:
    async with openai.AsyncOpenAI(base_url=server + "/v1", api_key="x", max_retries=0) as client:
        whole = await client.chat.completions.create(**body("chat", "B. " + PROMPT, False))
        chunks = [c async for c in await client.chat.completions.create(**body("chat", "B. " + PROMPT, True))]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    report = (chunks[-1].model_extra or {})["leyline"]
    prompt = whole.usage.prompt_tokens
    assert report["reused_tokens"] + report["prefilled_tokens"] == prompt, report  # the counts, at the end


async def test_the_openai_client_reads_a_responses_stream_with_keep_alives(server: str) -> None:
    async with openai.AsyncOpenAI(base_url=server + "/v1", api_key="x", max_retries=0) as client:
        raw = await client.responses.with_raw_response.create(**body("responses", "C. " + PROMPT, True))
        events = [e async for e in raw.parse()]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    report = (final.response.model_extra or {})["leyline"]
    usage = final.response.usage
    assert usage is not None and report["reused_tokens"] + report["prefilled_tokens"] == usage.input_tokens, report
    assert report["session_id"] == raw.headers["x-leyline-session"]  # known when the stream started
    assert "x-leyline-prefilled-tokens" not in raw.headers  # not known then


async def test_the_anthropic_client_reads_a_messages_stream_with_pings(server: str) -> None:
    async with anthropic.AsyncAnthropic(base_url=server, api_key="x", max_retries=0) as client:
        messages = [{"role": "user", "content": "D. " + PROMPT}]
        request = {"model": MODEL, "max_tokens": 100_000, "messages": messages, "extra_body": {"temperature": 0}}
        async with client.messages.stream(**request) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_message()
            headers = stream.response.headers
    start = next(e for e in events if e.type == "message_start")
    delta = next(e for e in events if e.type == "message_delta")
    usage = final.usage
    prompt = start.message.usage.input_tokens  # the prompt's length, at the start
    assert (usage.input_tokens or 0) + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0
    ) == prompt, usage  # the cache split, at the end
    report = (delta.model_extra or {})["leyline"]
    assert report["reused_tokens"] + report["prefilled_tokens"] == prompt, report
    assert report["session_id"] == headers["x-leyline-session"]
    assert int(headers["x-leyline-max-tokens-capped"]) == 4096 - prompt  # the cap: known at the start
    assert "x-leyline-prefilled-tokens" not in headers


@pytest.mark.parametrize("protocol", list(PATHS))
def test_a_whole_answer_reports_its_counts_as_headers_too(server: str, protocol: str) -> None:
    r = httpx.post(server + PATHS[protocol], json=body(protocol, f"E {protocol}. " + PROMPT, False), timeout=60)
    assert r.status_code == 200, r.text
    report = r.json()["leyline"]
    for name in ("reused", "rotated", "prefilled", "approximate"):
        assert int(r.headers[f"x-leyline-{name}-tokens"]) == report[f"{name}_tokens"]
