"""Composable KV blocks through the SDK and the strict fake server (its block routes are the oracle).

The fake server checks block directives as the real one does (owner, tokens equal or empty,
unknown → ``span_invalid``) and ``apply(base, D)`` against its own rendering of the prompt.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import NotFoundError

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import StaleToolDetector, TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Mode
from leyline_sdk.core.directives import Directive, apply
from leyline_sdk.session.blocks import BLOCK_KEY
from tests.policies.transcripts import read_write_conversation
from tests.sdk.fake_server import FakeLeyline

SKILL = {"role": "system", "content": "# Skill: config parsing\n" + "Parse keys with get(); never index.\n" * 20}
DOC = {"role": "user", "content": "Reference document:\n" + "\n".join(f"line {i}: value {i * i}" for i in range(40))}


def make_client(fake: FakeLeyline, **kwargs) -> AsyncLeyline:
    return AsyncLeyline(base_url="http://fake/v1", http_client=fake.client(), max_retries=0, **kwargs)


def sent(seen) -> list[Directive]:
    return [Directive.model_validate(d) for d in (seen.leyline or {}).get("directives", [])]


def block_posts(fake: FakeLeyline) -> int:
    return sum(1 for method, path in fake.requests if method == "POST" and path == "/v1/leyline/blocks")


async def test_blocks_api_create_retrieve_delete_and_owner_scope(chat):
    fake = FakeLeyline(chat)
    a, b = make_client(fake, api_key="key-a"), make_client(fake, api_key="key-b")
    block = await a.blocks.create(tokens=[5, 6, 7])
    assert block.id.startswith("blk_") and (block.object, block.length, block.tokens) == ("leyline.block", 3, [5, 6, 7])
    assert (await a.blocks.retrieve(block.id)).tokens == [5, 6, 7]
    for call in (b.blocks.retrieve(block.id), b.blocks.delete(block.id)):  # another key's block is unknown
        with pytest.raises(NotFoundError) as info:
            await call
        assert info.value.code == "block_not_found"
    made = await a.blocks.create(messages=[{**SKILL, BLOCK_KEY: True}])  # the marker never reaches the server
    rendered = chat.render([SKILL], add_generation_prompt=False)
    assert made.tokens == rendered.tokens[rendered.message_spans[0].start : rendered.message_spans[0].end]
    await a.blocks.delete(block.id)
    with pytest.raises(NotFoundError):
        await a.blocks.retrieve(block.id)
    with pytest.raises(ValueError, match="exactly one of"):
        await a.blocks.create()
    with pytest.raises(ValueError, match="token ids"):
        await a.blocks.create(tokens=[1, -2])
    await a.aclose()
    await b.aclose()


async def run_turns(session, fake, turns):
    """Send each history; return the fake's view of every request."""
    for history in turns:
        await session.create(model="m", messages=history)
    return fake.chats[-len(turns) :]


def skill_turns(message):
    """Turn 0: the task; turn 1: a tool turn, then the skill message arrives; turn 2: more work."""
    t0 = [SYSTEM, TASK]
    t1 = t0 + agent_turn(0) + [message]
    return [t0, t1, t1 + agent_turn(1)]


@pytest.mark.parametrize("how", ["marker", "add_block_message"])
async def test_a_new_block_message_is_placed_by_an_exact_insertion(chat, how):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat, api_key="key-a")
    session = client.session(tools=TOOLS)
    turns = skill_turns({**SKILL, BLOCK_KEY: True})
    if how == "add_block_message":
        turns = skill_turns(SKILL)
        await session.create(model="m", messages=turns[0])
        session.add_block_message(SKILL)
        assert session.history == turns[0] + [SKILL]
        seen = await run_turns(session, fake, turns[1:])
        seen = [fake.chats[0], *seen]
    else:
        seen = await run_turns(session, fake, turns)
    assert all(BLOCK_KEY not in m for c in seen for m in c.messages)  # stripped before sending
    base = fake.chats[0].prompt + fake._completion_tokens()
    directives = sent(seen[1])
    gap, place = directives[-2], directives[-1]
    span = chat.render(seen[1].messages, tools=TOOLS).message_spans[-1]  # the skill, where the server put it
    assert (place.start, place.end, place.block) == (len(base), len(base), fake.placed[0])
    assert list(place.replacement) == seen[1].prompt[span.start : span.end] == fake.blocks[place.block][1]
    assert (gap.start, gap.end, gap.block) == (len(base), len(base), None)
    assert apply(base, directives) == seen[1].prompt[: span.end]  # the prompt continues after the block
    assert seen[1].fallback is None and session.stats[1].blocks == 1 and session.stats[1].block_fallback is None
    assert session.stats[1].rotated_tokens >= len(place.replacement)  # relocated, not prefilled
    assert session.stats[2].blocks == 0 and seen[2].fallback is None  # in the base now: nothing to place
    await client.aclose()


async def test_blocks_are_reused_by_content_and_unknown_ones_fall_back_then_recover(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat)
    turns = skill_turns({**DOC, BLOCK_KEY: True})
    await run_turns(client.session(tools=TOOLS), fake, turns)
    await run_turns(client.session(tools=TOOLS), fake, turns)
    assert block_posts(fake) == 1 and len(fake.placed) == 2 and fake.placed[0] == fake.placed[1]
    fake.blocks.clear()  # the server dropped it (LRU under pressure)
    session = client.session(tools=TOOLS)
    seen = await run_turns(session, fake, turns)
    assert seen[1].fallback == "span_invalid" and fake.placed[-1] in seen[1].fallback_message
    assert session.stats[1].fallback == "span_invalid" and session.stats[1].blocks == 1
    assert seen[2].fallback is None  # served anyway; the session goes on splicing
    session = client.session(tools=TOOLS)
    seen = await run_turns(session, fake, turns)  # verified (404), created again, placed
    assert seen[1].fallback is None and block_posts(fake) == 2 and fake.placed[-1] in fake.blocks
    assert ("GET", f"/v1/leyline/blocks/{fake.placed[-2]}") in fake.requests
    await client.blocks.delete(fake.placed[-1])  # deleted by the client: forgotten, made again when needed
    seen = await run_turns(client.session(tools=TOOLS), fake, turns)
    assert seen[1].fallback is None and block_posts(fake) == 3 and fake.placed[-1] in fake.blocks
    await client.aclose()


async def test_no_block_directive_without_a_base_or_without_block_routes(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat)
    session = client.session(tools=TOOLS)
    await session.create(model="m", messages=[SYSTEM, {**SKILL, BLOCK_KEY: True}, TASK])
    assert session.stats[0].block_fallback == "no_base" and block_posts(fake) == 0  # a new session: prefilled
    plain = FakeLeyline(chat, block_routes=False)
    client = make_client(plain, tokenizer=chat)
    for _ in range(2):
        seen = await run_turns(client.session(tools=TOOLS), plain, skill_turns({**SKILL, BLOCK_KEY: True}))
        assert all(c.fallback is None for c in seen) and all(d.block is None for d in sent(seen[1]))
    assert [s.block_fallback for s in client.sessions[-1].stats] == [None, "blocks_unsupported", None]
    assert block_posts(plain) == 1  # asked once, remembered
    await client.aclose()


async def test_seam_repair_is_set_on_amortize_directives(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, tokenizer=chat, seam_repair=3, policies=[TruncateOlderThanN(1)])
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    for turn in range(3):
        await session.create(model="m", messages=messages)
        messages += agent_turn(turn)
    await session.create(model="m", messages=messages + [{**DOC, BLOCK_KEY: True}])
    raw, seams = [], []
    for before, c in zip(fake.chats, fake.chats[1:], strict=False):
        base_length = len(before.prompt) + len(fake._completion_tokens())
        directives = (c.leyline or {}).get("directives", [])
        raw += directives
        seams += [d for d in directives if d["mode"] == "amortize" and not d.get("block") and d["end"] < base_length]
    assert seams and all(d["repair"] == 3 for d in seams)  # the evictions' seams (base tokens follow them)
    assert all(d.get("repair", 0) == 0 for d in raw if d["mode"] == "forget")
    assert [d["repair"] for d in raw if d.get("block")] == [3]  # and the placed block's head
    assert client.session(seam_repair=0).seam_repair == 0
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="seam_repair"):
            make_client(fake, seam_repair=bad)
    await client.aclose()


STEP = st.sampled_from(["read", "write", "run", "skill", "doc", "user"])


def scripted_history(steps: list[str], echo: bool) -> list[list[dict]]:
    """Histories of an agent that reads, writes, runs, loads skills and documents (block messages)."""
    history = list(read_write_conversation()[:2])
    out = [list(history)]
    for k, step in enumerate(steps):
        if step in ("read", "write", "run"):
            turn = read_write_conversation()[2:4] if step == "read" else read_write_conversation()[4:6]
            if step == "run":
                turn = agent_turn(k)
            ids = {m.get("tool_call_id") for m in turn} - {None}
            rename = {i: f"{i}_{k}" for i in ids}
            turn = [
                {
                    **m,
                    **({"tool_call_id": rename[m["tool_call_id"]]} if "tool_call_id" in m else {}),
                    **(
                        {"tool_calls": [{**c, "id": rename[c["id"]]} for c in m["tool_calls"]]}
                        if m.get("tool_calls")
                        else {}
                    ),
                }
                for m in turn
            ]
            if echo:
                turn[0] = {**turn[0], "content": "ok"}
            history += turn
        elif step in ("skill", "doc"):
            history.append({**(SKILL if step == "skill" else DOC), BLOCK_KEY: True})
        else:
            history.append({"role": "user", "content": f"continue {k}"})
        out.append(list(history))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(STEP, min_size=2, max_size=7),
    echo=st.booleans(),
    strategy=st.sampled_from(["erratum", "forget", "evict"]),
    repair=st.sampled_from([0, 2]),
)
def test_every_request_reproduces_the_servers_prompt(chat, steps, echo, strategy, repair):
    """Whatever the agent does, the fake server never sees a directive that does not reproduce its prompt."""

    async def scenario() -> None:
        fake = FakeLeyline(chat)
        policies = [StaleToolDetector(on_invalidated=strategy), TruncateOlderThanN(2)]
        client = make_client(fake, tokenizer=chat, policies=policies, seam_repair=repair)
        session = client.session()
        for turn, history in enumerate(scripted_history(steps, echo)):
            placed = len(fake.placed)
            await session.create(model="m", messages=history)
            seen, stats = fake.chats[-1], session.stats[-1]
            assert seen.fallback is None and stats.fallback is None, (seen.fallback_message, stats)
            assert stats.blocks == len([d for d in sent(seen) if d.block]) == len(fake.placed) - placed
            if turn and steps[turn - 1] in ("skill", "doc"):  # a new block message: placed, or why not
                assert stats.blocks == 1 or stats.block_fallback == "forget", stats
            if seen.leyline.get("directives"):  # applied: a prefix of the server's own rendering
                assert seen.spliced is not None and seen.prompt[: len(seen.spliced)] == seen.spliced
            assert all(d.mode is Mode.AMORTIZE or d.repair == 0 for d in sent(seen))
            assert session.base_tokens == fake.sessions[session.session_id]
        assert session.history == scripted_history(steps, echo)[-1]  # nothing lost
        await client.aclose()

    asyncio.run(scenario())
