"""``/v1/messages`` with Anthropic's own client: create, tools, forced calls, stream, count_tokens,
errors, caching across turns, and the server's context editing spliced.

The oracles: ``anthropic`` parses every answer into its own types (the stream through its own
accumulator), its exception classes catch the errors, and the Messages API's answer must be the
chat turn's — the same greedy text and prompt tokens as ``chat.completions`` on the same
conversation, from another key (its own cache: a fresh prefill). Context editing is checked
against its own definition, computed here: which results are cleared and how many tokens that
removes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest

from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_server.api.messages_api.context_edits import PLACEHOLDER
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
KEYS = ("sk-msg-a", "sk-msg-b", "sk-msg-c")
GREEDY: dict[str, Any] = {"max_tokens": 6, "extra_body": {"temperature": 0}}  # anthropic 2.16 has no temperature
NEXT = {"name": "read_next", "description": "Read the next file.",
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(make_service(MODEL, kv_budget_mb=64, api_keys=frozenset(KEYS))) as url:
        yield url


@pytest.fixture
async def client(server) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=server, api_key=KEYS[0], max_retries=0) as c:
        yield c


async def chat_answer(server: str, messages: list[dict[str, Any]], **kw: Any) -> tuple[str, int]:
    """The chat turn's own greedy answer and prompt tokens, from another key (the oracle)."""
    async with openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEYS[1]) as plain:
        out = await plain.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=6, **kw)
    assert out.usage is not None
    return out.choices[0].message.content or "", out.usage.prompt_tokens


def prompt_of(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)


def text_of(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


async def test_create_answers_as_the_chat_turn_does(client, server):
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}]
    message = await client.messages.create(model=MODEL, system=system, messages=messages, **GREEDY)
    assert isinstance(message, anthropic.types.Message) and message.stop_reason == "max_tokens"
    text, prompt = await chat_answer(server, [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Say hi."}])  # fmt: skip
    assert text_of(message) == text and prompt_of(message.usage) == prompt
    assert message.usage.input_tokens == 0  # marked for caching: the computed tokens are cache writes
    counted = await client.messages.count_tokens(model=MODEL, system=system, messages=messages)
    assert counted.input_tokens == prompt


def scripted_history() -> list[dict[str, Any]]:
    """A tool_use / tool_result exchange replayed (an earlier run's), then a question."""
    return [
        {"role": "user", "content": "Read the first file."},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "read_next", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1"},
                                     {"type": "text", "text": "And now?"}]},
    ]  # fmt: skip


async def test_a_tool_history_is_the_chat_conversation_it_stands_for(client, server):
    message = await client.messages.create(model=MODEL, messages=scripted_history(), tools=[NEXT], **GREEDY)
    chat = [{"role": "user", "content": "Read the first file."},
            {"role": "assistant", "content": "Reading.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "read_next", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "x = 1"},
            {"role": "user", "content": "And now?"}]  # fmt: skip
    tool = {"type": "function", "function": {"name": "read_next", "description": "Read the next file.",
                                             "parameters": NEXT["input_schema"]}}  # fmt: skip
    text, prompt = await chat_answer(server, chat, tools=[tool])
    assert text_of(message) == text and prompt_of(message.usage) == prompt


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "read_next"}, {"type": "any"}])
async def test_a_forced_call_is_a_tool_use_block_streamed_or_not(client, choice):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": [NEXT], "tool_choice": choice,
          "max_tokens": 64}  # fmt: skip
    whole = await client.messages.create(**kw)
    async with client.messages.stream(**kw) as stream:
        kinds = [event.type async for event in stream]
        streamed = await stream.get_final_message()  # anthropic's own accumulator of the events
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use", message
        calls = [b for b in message.content if b.type == "tool_use"]
        assert calls and all(c.name == "read_next" and c.input == {} for c in calls), message
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1


async def test_stream_text_is_the_whole_answer(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Count."}], **GREEDY}
    whole = await client.messages.create(**kw)
    async with client.messages.stream(**kw) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == text_of(final) == text_of(whole)
    assert final.usage.output_tokens == whole.usage.output_tokens == 6


async def test_a_stop_sequence_ends_the_answer_and_is_named(client):
    kw = {"model": MODEL, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 12,
          "extra_body": {"temperature": 0}}  # fmt: skip
    full = text_of(await client.messages.create(**kw))
    stop = full[len(full) // 2 :][:3]
    assert stop.strip(), full
    cut = await client.messages.create(**kw, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text_of(cut) == full[: full.index(stop)]


async def test_max_tokens_past_the_context_is_capped_and_said(client):
    raw = await client.messages.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=32_000, stream=True
    )
    assert int(raw.headers["x-leyline-max-tokens-capped"]) < 32_000
    async for _ in await raw.parse():
        pass


async def test_errors_are_anthropics(server, client):
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(model="no-such-model", messages=[{"role": "user", "content": "x"}], **GREEDY)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model=MODEL, messages=[{"role": "user", "content": [image]}], **GREEDY)
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages.0.content.0.type" in caught.value.message
    with pytest.raises(anthropic.BadRequestError, match="container"):
        await client.messages.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                     extra_body={"container": "c1"}, max_tokens=4)  # fmt: skip
    async with anthropic.AsyncAnthropic(base_url=server, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError):
            await stranger.messages.create(model=MODEL, messages=[{"role": "user", "content": "x"}], **GREEDY)


async def test_the_next_turn_reads_the_previous_prompt_from_the_cache(client):
    messages: list[dict[str, Any]] = [{"role": "user", "content": "One."}]
    first = await client.messages.create(model=MODEL, messages=messages, **GREEDY)
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Two."}]  # type: ignore[dict-item]
    second = await client.messages.create(model=MODEL, messages=messages, **GREEDY)
    assert (second.usage.cache_read_input_tokens or 0) >= prompt_of(first.usage)


# -- context editing: clear_tool_uses_20250919 on a 6-turn tool loop -------------------------------
CLEAR = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
                    "keep": {"type": "tool_uses", "value": 2}}]}  # fmt: skip


def file_text(i: int) -> str:
    return f"# file {i}\n" + "".join(f"value_{i}_{k} = {k * k}\n" for k in range(30))


def tokens(text: str) -> int:
    return len(load_tiny_tokenizer().encode(text, add_special_tokens=False))


async def clearing_loop(
    server: str, key: str, headers: dict[str, str], messages: list[dict[str, Any]] | None = None
) -> list[tuple[Any, dict[str, str]]]:
    """Six turns of forced calls; each request asks the server to clear all but the 2 latest results
    (``messages``: the conversation, extended in place)."""
    messages = [] if messages is None else messages
    messages.append({"role": "user", "content": "Read every file."})
    out = []
    async with anthropic.AsyncAnthropic(base_url=server, api_key=key, default_headers=headers, max_retries=0) as c:
        for turn in range(1, 7):
            raw = await c.messages.with_raw_response.create(
                model=MODEL, messages=messages, tools=[NEXT], max_tokens=64,
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                extra_body={"temperature": 0, "context_management": CLEAR},
            )  # fmt: skip
            message = await raw.parse()
            out.append((message, dict(raw.headers)))
            (call,) = [b for b in message.content if b.type == "tool_use"]
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                       "content": file_text(turn)}]}]  # fmt: skip
    return out


def expected_edits(turn: int) -> list[dict[str, Any]]:
    """Turn ``turn`` holds ``turn - 1`` tool uses; from 3 on, all but the latest 2 are cleared."""
    uses = turn - 1
    if uses < 3:
        return []
    cleared = uses - 2
    removed = sum(tokens(file_text(i)) - tokens(PLACEHOLDER) for i in range(1, cleared + 1))
    return [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": cleared, "cleared_input_tokens": removed}]


async def test_clear_tool_uses_is_reported_as_anthropic_does_and_spliced_under_the_opt_in(server):
    answers = await clearing_loop(server, KEYS[2], {"X-Leyline-Client-Edits": "amortize"})
    sessions = {headers["x-leyline-session"] for _, headers in answers}
    assert len(sessions) == 1, sessions  # one conversation, one session, through every clearing
    for turn, (message, headers) in enumerate(answers, start=1):
        applied = message.model_dump()["context_management"]["applied_edits"]
        assert applied == expected_edits(turn), (turn, applied)
        assert "x-leyline-fallback" not in headers, headers
        if turn >= 5:  # one more result cleared than the turn before, later content kept: spliced
            assert int(headers["x-leyline-rotated-tokens"]) > 0, (turn, headers)


def cleared_chat(messages: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """The loop's conversation as chat messages, all but the ``keep`` latest results cleared (the oracle)."""
    chat: list[dict[str, Any]] = []
    for m in messages:
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        calls = [{"id": b["id"], "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b["input"])}} for b in uses]  # fmt: skip
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        if m["role"] == "assistant":
            chat.append({"role": "assistant", "content": "\n\n".join(texts) or None, "tool_calls": calls})
        else:
            chat += [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
                     for b in blocks if b["type"] == "tool_result"]  # fmt: skip
            chat += [{"role": "user", "content": "\n\n".join(texts)}] if texts else []
    results = [m for m in chat if m["role"] == "tool"]
    for m in results[: len(results) - keep]:
        m["content"] = PLACEHOLDER
    return chat


async def test_clear_tool_uses_without_the_opt_in_is_exact(server):
    messages: list[dict[str, Any]] = []
    answers = await clearing_loop(server, KEYS[0], {}, messages)
    for turn, (message, headers) in enumerate(answers, start=1):
        assert int(headers["x-leyline-approximate-tokens"]) == 0, (turn, headers)
        assert message.model_dump()["context_management"]["applied_edits"] == expected_edits(turn)
    messages.append({"role": "user", "content": "Done?"})
    async with anthropic.AsyncAnthropic(base_url=server, api_key=KEYS[0], max_retries=0) as c:
        final = await c.messages.create(model=MODEL, messages=messages, tools=[NEXT], max_tokens=6,
                                        extra_body={"temperature": 0, "context_management": CLEAR})  # fmt: skip
    tool = {"type": "function", "function": {"name": "read_next", "description": "Read the next file.",
                                             "parameters": NEXT["input_schema"]}}  # fmt: skip
    text, prompt = await chat_answer(server, cleared_chat(messages, keep=2), tools=[tool])
    assert text_of(final) == text and prompt_of(final.usage) == prompt  # a fresh prefill's answer
