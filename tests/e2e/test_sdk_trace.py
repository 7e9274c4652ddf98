"""A 30-turn agent trace through AsyncLeyline with TruncateOlderThanN(2), against the real server."""

from __future__ import annotations

import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN, run_policies
from leyline_sdk import AsyncLeyline, apply
from tests.e2e.server_helpers import make_service, running_server

TURNS = 30


@pytest.fixture(scope="module")
def server():
    with running_server(make_service(kv_budget_mb=64, max_context_tokens=32_000)) as url:
        yield url


async def test_thirty_turns_splice_only_the_stubs_and_the_new_turn(server):
    client = AsyncLeyline(base_url=server + "/v1", policies=[TruncateOlderThanN(2)])
    session = client.session(tools=TOOLS)
    messages = [SYSTEM, TASK]
    first_eviction = None
    for turn in range(TURNS):
        base_before = list(session.base_tokens or [])
        response = await session.create(model="tiny-mla", messages=messages, max_tokens=3)
        stats = session.stats[-1]
        assert response.leyline["session_id"] == session.session_id
        assert stats.fallback is None, stats
        directives = session.last_directives
        if first_eviction is None and stats.cleared:
            first_eviction = turn
        if first_eviction is not None and turn > first_eviction or (first_eviction == turn and base_before):
            # the stubs and, per stub, the seam repair's few tokens after it (recomputed, not rotated)
            stubs = sum(len(d.replacement) + d.repair for d in directives if d.mode.value == "amortize")
            repaired = sum(d.repair for d in directives if d.mode.value == "amortize")
            spliced = apply(base_before, directives)
            new_turn = (
                stats.prompt_tokens
                - len(spliced)
                + sum(len(d.replacement) for d in directives if d.mode.value == "forget")
            )
            removed = sum(d.end - d.start for d in directives)
            assert stats.prefilled_tokens <= stubs + new_turn, (turn, stats)
            assert stats.cached_tokens >= len(base_before) - removed - repaired, (turn, stats)
        messages += agent_turn(turn)
    assert first_eviction is not None and first_eviction <= 3
    assert sum(s.rotated_tokens for s in session.stats) > 0
    # nothing lost: the full history is the agent's; the effective one is shorter
    assert session.history == messages[: len(session.history)]
    assert sum(len(str(m.get("content"))) for m in session.effective) < sum(
        len(str(m.get("content"))) for m in session.history
    )
    await client.aclose()


async def test_same_trace_plain_re_prefill_for_contrast():
    """The same trace and policies as plain OpenAI usage (no directives) on a fresh server: every
    eviction re-prefills everything after the evicted message. Leyline on another fresh server."""
    import openai

    turns = 12
    with running_server(make_service(kv_budget_mb=64, max_context_tokens=32_000)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        messages, sticky, plain = [SYSTEM, TASK], {}, []
        for turn in range(turns):
            effective, sticky, _ = run_policies(messages, [TruncateOlderThanN(2)], TOOLS, sticky=sticky)
            r = await client.chat.completions.create(model="tiny-mla", messages=effective, tools=TOOLS, max_tokens=3)
            plain.append(r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens)
            messages += agent_turn(turn)
    with running_server(make_service(kv_budget_mb=64, max_context_tokens=32_000)) as url:
        leyline_client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)])
        session = leyline_client.session(tools=TOOLS)
        messages = [SYSTEM, TASK]
        for turn in range(turns):
            await session.create(model="tiny-mla", messages=messages, max_tokens=3)
            messages += agent_turn(turn)
        spliced = [s.prefilled_tokens for s in session.stats]
        await leyline_client.aclose()
    # with n=2 the plain client re-prefills the last two turns each time; Leyline only the stub + new turn
    assert all(sp < pl for sp, pl in zip(spliced[4:], plain[4:], strict=True)), (plain, spliced)
    assert sum(plain[4:]) > 1.7 * sum(spliced[4:]), (plain, spliced)
