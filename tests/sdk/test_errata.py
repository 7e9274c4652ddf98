"""Errata through a session and the strict fake server: byte-stable, appended, nothing rewritten.

The fake server renders every prompt itself; these tests compare its renderings across turns
(the oracle) rather than what the SDK believes it sent.
"""

from __future__ import annotations

import pytest

from leyline_policies import StaleToolDetector, TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Mode
from tests.policies.transcripts import OLD_APP, later_turns, read_write_conversation
from tests.sdk.fake_server import FakeLeyline


def make_client(fake: FakeLeyline, **kwargs) -> AsyncLeyline:
    return AsyncLeyline(base_url="http://fake/v1", http_client=fake.client(), max_retries=0, **kwargs)


def turns():
    """The agent's history before each request: read, write (the fact changes), then more work."""
    full = read_write_conversation() + later_turns(1, 4)
    return [full[:4], full[:6], full[:8], full[:10], full[:12], full[:14]]


def messages_end(chat, messages) -> int:
    """Where the messages of a rendered prompt end (the generation prompt follows)."""
    return chat.render(messages).message_spans[-1].end


@pytest.mark.parametrize("extra", [[], [TruncateOlderThanN(3)]], ids=["detector", "detector+truncate"])
async def test_erratum_renders_byte_for_byte_at_the_same_place_every_later_turn(chat, extra):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[StaleToolDetector(), *extra], tokenizer=chat)
    session = client.session()
    for history in turns():
        await session.create(model="m", messages=history)
        assert fake.chats[-1].fallback is None and session.stats[-1].fallback is None
    seen = fake.chats
    erratum_at = 6  # right after the write's result, where the history ended when the fact changed
    assert seen[0].messages == turns()[0]  # no erratum before the write
    first = seen[1].messages[erratum_at]
    assert first["role"] == "user" and first["content"].startswith("[erratum] The earlier output of read_file(")
    assert session.stats[1].cleared == 1
    for k in range(1, len(seen)):
        assert seen[k].messages[erratum_at] == first  # same place, same bytes
        if k + 1 < len(seen) and not extra:  # turn k's rendered messages are a prefix of turn k+1's
            end = messages_end(chat, seen[k].messages)
            assert seen[k + 1].prompt[:end] == seen[k].prompt[:end]
    # the erratum is an append: no directive touched the prompt part of a base (only evictions do)
    for k in range(1, 2 if extra else len(seen)):
        assert all(d.start >= len(seen[k - 1].prompt) for d in _directives(seen[k]))
    if extra:  # the read was evicted later (amortize stub); its erratum did not move
        assert seen[-1].messages[3]["content"].startswith("[evicted: read_file")
    assert session.history == turns()[-1]  # nothing lost: the full history holds the original
    assert session.history[3]["content"] == OLD_APP
    await client.aclose()


async def test_forget_strategy_recomputes_from_the_outdated_read(chat):
    fake = FakeLeyline(chat)
    client = make_client(fake, policies=[StaleToolDetector(on_invalidated="forget")], tokenizer=chat)
    session = client.session()
    for history in turns()[:3]:
        await session.create(model="m", messages=history)
        assert fake.chats[-1].fallback is None
    write_turn = fake.chats[1]
    (first, *_) = _directives(write_turn)
    read_span = chat.render(fake.chats[0].messages).message_spans[3]
    assert first.mode is Mode.FORGET and read_span.start < first.start < read_span.end  # from the field on
    assert write_turn.messages[3]["content"].startswith("[outdated: read_file")
    assert all("[erratum]" not in str(m.get("content")) for m in write_turn.messages)
    assert session.stats[1].rotated_tokens == 0  # nothing after the edit kept its notes
    await client.aclose()


def _directives(seen):
    from leyline_sdk.core.directives import Directive

    return [Directive.model_validate(d) for d in (seen.leyline or {}).get("directives", [])]
