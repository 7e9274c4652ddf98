"""The server's rendering: exactly the SDK's renders, off the event loop, bounded, incremental per conversation."""

from __future__ import annotations

import asyncio
import time

import pytest

from leyline_server.api.config import ServerConfig
from leyline_server.api.errors import APIError
from leyline_server.api.render import RenderService


def conversation(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 3} for i in range(n)]


@pytest.fixture
def render(hf_tokenizer):
    service = RenderService(hf_tokenizer, ServerConfig(model_name="m", render_timeout_s=5.0), context_tokens=4096)
    yield service
    service.close()


async def test_tokens_and_spans_equal_the_sdk_render(render, chat):
    messages = conversation(9)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    expected = chat.render(messages, tools=tools)
    assert await render.tokens("k", messages, tools, True) == expected.tokens
    rendered, snapshot = await render.spans("k", messages, tools, True)
    assert rendered == expected and snapshot is not None


async def test_a_conversations_next_turn_renders_only_its_new_messages(render, chat):
    messages = conversation(40)
    first, _ = await render.spans("k", messages, None, True)
    assert render.full_renders == 1 and render.incremental_renders == 0
    longer = messages + conversation(2)
    second, _ = await render.spans("k", longer, None, True)
    assert render.incremental_renders == 1  # from the key's last rendering of this conversation
    assert second == chat.render(longer)  # the same as a full render
    await render.spans("other-key", longer, None, True)
    assert render.full_renders == 2  # another key never starts from this key's renderings


async def test_bounds_messages_characters_and_time(hf_tokenizer):
    config = ServerConfig(model_name="m", max_messages=50, render_timeout_s=0.002)
    render = RenderService(hf_tokenizer, config, context_tokens=100)
    try:
        with pytest.raises(APIError) as info:
            await render.tokens("k", conversation(51), None, True)
        assert info.value.code == "too_many_messages"
        with pytest.raises(APIError) as info:
            await render.tokens("k", [{"role": "user", "content": "x" * 3201}], None, True)  # 32 per token
        assert info.value.code == "context_length_exceeded"
        started = time.perf_counter()
        with pytest.raises(APIError) as info:
            await render.spans("k", conversation(50), None, True)  # a render per message: past 2 ms
        assert info.value.code == "render_timeout" and time.perf_counter() - started < 2
    finally:
        render.close()


async def test_the_event_loop_runs_while_a_render_does(render):
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    await render.spans("k", conversation(600), None, True)
    ticker.cancel()
    assert ticks > 5
