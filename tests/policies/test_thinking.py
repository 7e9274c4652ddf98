"""ClearThinking: old reasoning becomes a stub (or goes), in the content or in ``reasoning_content``, as a splice."""

from __future__ import annotations

import pytest

from benchmarks.traces import TOOLS, messages_at, reasoning_agent_trace
from leyline_policies import ClearThinking, Conversation, Mode, load_policy, run_policies
from leyline_policies.thinking import reasoning_of
from leyline_sdk import AsyncLeyline
from tests.sdk.fake_server import FakeLeyline
from tests.sdk.reasoning_templates import answer_text, make_chat


def trace(in_field: bool, turns: int = 6) -> list[dict]:
    return messages_at(reasoning_agent_trace(turns=turns, calls_per_query=10, reasoning_in_field=in_field), turns - 1)


@pytest.mark.parametrize("in_field", [False, True], ids=["think-in-content", "reasoning_content"])
def test_reasoning_older_than_the_last_k_turns_becomes_a_stub(in_field):
    messages = trace(in_field)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    edits = ClearThinking(keep=2).propose(Conversation.of(messages, TOOLS))
    assert [e.index for e in edits] == assistants[:-2]
    for e in edits:
        assert e.mode is Mode.AMORTIZE and e.field == ("reasoning_content" if in_field else "content")
        field, reasoning = reasoning_of(messages[e.index])
        assert e.removed_chars == len(reasoning) and f"{len(reasoning):,} chars" in e.replacement
    effective, sticky, report = run_policies(messages, [ClearThinking(keep=2)], TOOLS)
    for i in assistants[:-2]:
        field, reasoning = reasoning_of(effective[i])
        assert reasoning.strip().startswith("[reasoning cleared")
        assert effective[i]["tool_calls"] == messages[i]["tool_calls"]  # the call and its result stay paired
        kept = messages[i]["content"].split("</think>")[-1] if not in_field else messages[i]["content"]
        assert effective[i]["content"].endswith(kept)  # the answer itself is untouched
    assert all(effective[i] == messages[i] for i in assistants[-2:])
    _, _, again = run_policies(messages, [ClearThinking(keep=2)], TOOLS, sticky=sticky)
    assert again.cleared == []  # sticky: never cleared twice, byte-stable


@pytest.mark.parametrize("in_field", [False, True], ids=["think-in-content", "reasoning_content"])
def test_without_a_stub_reasoning_disappears(in_field):
    messages = trace(in_field)
    effective, _, report = run_policies(messages, [ClearThinking(keep=1, stub=None)], TOOLS)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert [c.index for c in report.cleared] == assistants[:-1]
    assert all(reasoning_of(effective[i]) is None for i in assistants[:-1])
    assert reasoning_of(effective[assistants[-1]]) == reasoning_of(messages[assistants[-1]])


def test_arguments_are_checked_and_the_policy_is_registered():
    with pytest.raises(ValueError):
        ClearThinking(keep=-1)
    with pytest.raises(ValueError):
        ClearThinking(stub="gone")  # would be cleared again next turn
    assert isinstance(load_policy("clear-thinking", keep=3), ClearThinking)
    short = ClearThinking(keep=0, min_chars=10_000).propose(Conversation.of(trace(False)))
    assert short == []


@pytest.mark.parametrize("in_field", [False, True], ids=["think-in-content", "reasoning_content"])
async def test_clearing_reasoning_the_template_keeps_is_a_splice(in_field):
    chat = make_chat("keep")
    fake = FakeLeyline(chat)
    client = AsyncLeyline(base_url="http://fake/v1", http_client=fake.client(), max_retries=0, tokenizer=chat)
    session = client.session(tools=TOOLS, policies=[ClearThinking(keep=1)])
    steps = reasoning_agent_trace(turns=8, calls_per_query=10, reasoning_in_field=in_field)
    for t, step in enumerate(steps):
        messages = messages_at(steps, t)
        fake.completion = answer_text(chat, messages, step.answer, TOOLS)
        await session.create(model="m", messages=messages)
        seen, stats = fake.chats[-1], session.stats[-1]
        assert stats.fallback is None and seen.fallback is None
        if t >= 2:  # the reasoning of the answer before last is cleared, in place
            assert seen.spliced is not None and seen.prompt[: len(seen.spliced)] == seen.spliced  # the oracle
            assert stats.policy_directives == 1 and stats.template_directives == 0 and stats.rotated_tokens > 0
            assert all(d.mode is Mode.AMORTIZE for d in session.last_directives)
    await client.aclose()
