"""LeylineSession against a strict fake server that renders every prompt itself (the oracle).

The fake server (``tests/sdk/fake_server.py``) checks what the real one checks — the base's
length and digest, ``apply(base, D)`` a prefix of *its own full rendering* of the prompt — and
records what it saw, so these tests assert on the server's view of each turn.
"""

from __future__ import annotations

import copy

import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import StaleToolDetector, TruncateOlderThanN
from leyline_sdk import AsyncLeyline, HFChatTokenizer, Mode, SpliceFallbackError
from leyline_sdk.render.incremental import IncrementalRenderer
from tests.sdk.fake_server import FakeLeyline


def make_client(fake: FakeLeyline, **kwargs) -> AsyncLeyline:
    return AsyncLeyline(base_url="http://fake/v1", http_client=fake.client(), max_retries=0, **kwargs)


@pytest.mark.parametrize("local", [True, False], ids=["local-tokenizer", "server-tokenize"])
async def test_trace_splices_every_turn_with_at_most_one_tokenize(chat, local):
    fake = FakeLeyline(chat)
    tokenizer = HFChatTokenizer(chat.tokenizer) if local else None
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=tokenizer)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(8):
        calls = fake.tokenize_calls()
        await session.create(model="m", messages=messages)
        seen, stats = fake.chats[-1], session.stats[-1]
        # over HTTP one /tokenize per turn; locally only the one-time probe
        assert fake.tokenize_calls() - calls == (1 if not local or turn == 0 else 0)
        assert stats.fallback is None and seen.fallback is None, (turn, stats)
        if turn > 0:  # the server applied the directives and found them a prefix of its own render
            assert seen.spliced is not None and seen.leyline["directives"]
            assert seen.prompt[: len(seen.spliced)] == seen.spliced
        assert session.base_tokens == fake.sessions[session.session_id]
        messages += agent_turn(turn)
    assert sum(s.cleared for s in session.stats) >= 4 and sum(s.rotated_tokens for s in session.stats) > 0
    assert session.history == messages[: len(session.history)]  # nothing lost
    if local:
        renderer = session.renderer.tokenizer
        assert isinstance(renderer, IncrementalRenderer) and renderer.full_renders == 1
    await client.aclose()


async def test_generated_tokens_that_match_the_next_message_are_kept(chat):
    fake = FakeLeyline(chat, completion="Looking at the files.")
    client = make_client(fake, policies=[TruncateOlderThanN(1)], tokenizer=chat)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(4):
        response = await session.create(model="m", messages=messages)
        directives = session.last_directives
        if turn > 0:  # the agent echoed the model's answer: no cut of the generated tokens
            assert all(d.mode is Mode.AMORTIZE for d in directives) and fake.chats[-1].spliced is not None
            assert len(fake.chats[-1].spliced) > len(fake.chats[-2].prompt)  # the completion was kept
        messages += [{"role": "assistant", "content": response.choices[0].message.content}, agent_turn(turn)[1]]
        messages[-1] = {"role": "user", "content": messages[-1]["content"]}
    # an agent that records another answer than the model's: the generated tokens are dropped (forget)
    messages[-2] = {"role": "assistant", "content": "something else"}
    await session.create(model="m", messages=messages)
    cut = session.last_directives[-1]
    assert cut.mode is Mode.FORGET and cut.end == len(fake.chats[-2].prompt) + len(fake._completion_tokens())
    assert fake.chats[-1].fallback is None and session.stats[-1].fallback is None
    await client.aclose()


async def test_dropped_server_session_is_replaced_and_splicing_resumes(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=chat)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(3):
        await session.create(model="m", messages=messages)
        messages += agent_turn(turn)
    old_id = session.session_id
    fake.drop(old_id)  # the server's LRU dropped the idle session
    r = await session.create(model="m", messages=messages)
    assert session.stats[-1].fallback == "base_mismatch" and r.leyline["fallback"]["code"] == "base_mismatch"
    assert session.session_id == r.leyline["session_id"] != old_id
    assert session.base_tokens == fake.sessions[session.session_id]  # the new base, adopted
    messages += agent_turn(3)
    await session.create(model="m", messages=messages)
    assert session.stats[-1].fallback is None and fake.chats[-1].spliced is not None
    assert fake.chats[-1].leyline["session_id"] == session.session_id
    await client.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_strict_session_raises_when_its_server_session_is_gone_then_starts_over(chat, stream):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=chat, strict=True)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK, *agent_turn(0)]
    await session.create(model="m", messages=messages)
    fake.drop(session.session_id)
    with pytest.raises(SpliceFallbackError) as info:  # the real server: 404 session_not_found when strict
        r = await session.create(model="m", messages=messages + agent_turn(1), stream=stream)
        if stream:
            [c async for c in r]
    assert info.value.code == "session_not_found" and session.session_id is None
    await session.create(model="m", messages=messages + agent_turn(1))  # a new session, no fallback
    assert session.stats[-1].fallback is None and session.session_id in fake.sessions
    await session.create(model="m", messages=messages + agent_turn(1) + agent_turn(2))
    assert session.stats[-1].fallback is None and fake.chats[-1].spliced is not None
    await client.aclose()


async def test_strict_session_raises_on_a_server_fallback_after_adopting_its_base(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=chat, strict=True)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK, *agent_turn(0)]
    await session.create(model="m", messages=messages)
    session.server.base_digest = "sha256:" + "0" * 32  # the server will not recognise the base we send
    with pytest.raises(SpliceFallbackError) as info:
        await session.create(model="m", messages=messages + agent_turn(1))
    assert info.value.code == "base_mismatch" and fake.chats[-1].fallback == "base_mismatch"
    assert session.base_tokens == fake.sessions[session.session_id]  # the served turn's base, adopted
    await session.create(model="m", messages=messages + agent_turn(1) + agent_turn(2))
    assert session.stats[-1].fallback is None and fake.chats[-1].spliced is not None
    await client.aclose()


async def test_sync_edits_splices_without_generating(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=chat)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(3):
        await session.create(model="m", messages=messages)
        messages += agent_turn(turn)
    chats = len(fake.chats)
    session.history = list(messages)  # the agent appended its turn; the tool is still running
    stats = await session.sync_edits()
    assert stats is not None and stats.directives >= 1 and stats.rotated_tokens > 0 and stats.fallback is None
    assert len(fake.chats) == chats  # nothing generated
    assert fake.sessions[session.session_id] == session.base_tokens  # the server's base moved with ours
    assert await session.sync_edits() is None  # nothing new to send
    await session.create(model="m", messages=messages)
    assert session.stats[-1].fallback is None and fake.chats[-1].spliced is not None
    assert session.stats[-1].cleared == 0  # reported by the splice already
    await client.aclose()


async def test_sync_edits_on_a_dropped_session_starts_over(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(1)], tokenizer=chat)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(2):
        await session.create(model="m", messages=messages)
        messages += agent_turn(turn)
    fake.drop(session.session_id)
    session.history = list(messages)
    stats = await session.sync_edits()
    assert stats is not None and stats.fallback == "session_not_found" and session.session_id is None
    await session.create(model="m", messages=messages)
    assert session.stats[-1].fallback is None and session.session_id in fake.sessions
    await client.aclose()


async def test_disagreeing_local_tokenizer_sends_no_directives(chat):
    tok = copy.deepcopy(chat.tokenizer)
    tok.chat_template = tok.chat_template.replace(
        "<|im_start|>{{ message['role'] }}\n", "<|im_start|>{{ message['role'] }}:\n"
    )
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[TruncateOlderThanN(2)], tokenizer=HFChatTokenizer(tok))
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(4):
        await session.create(model="m", messages=messages)
        messages += agent_turn(turn)
    assert session.stats[0].fallback == "tokenizer_mismatch"
    assert all(s.directives == 0 for s in session.stats)
    assert all(not (c.leyline or {}).get("directives") for c in fake.chats)  # never wrong tokens
    await client.aclose()


async def test_streaming_records_the_final_chunk(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[StaleToolDetector(), TruncateOlderThanN(2)], tokenizer=chat)
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(4):
        stream = await session.create(model="m", messages=messages, stream=True)
        chunks = [c async for c in stream]
        assert chunks[-1].choices[0].finish_reason == "stop"
        messages += agent_turn(turn)
    last = session.stats[-1]
    assert last.fallback is None and last.rotated_tokens > 0
    assert last.approximate_tokens == fake.chats[-1].prompt.__len__() - last.reused_tokens
    assert last.prompt_tokens == len(fake.chats[-1].prompt)
    await client.aclose()


async def test_server_without_leyline_gets_plain_requests(chat):
    fake = FakeLeyline(chat, leyline=False)
    client = make_client(fake, policies=[TruncateOlderThanN(2)])
    messages = [SYSTEM, TASK]
    for turn in range(5):
        r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert r.choices[0].message.content == "ok"
        messages += agent_turn(turn)
    assert fake.tokenize_calls() == 1  # probed once, remembered
    assert all(c.leyline is None for c in fake.chats)
    assert fake.chats[-1].messages[3]["content"].startswith("[evicted: read_file")  # policies still apply
    assert len(client.sessions) == 1  # found by message prefix every turn
    await client.aclose()
