"""Built-in policies on realistic transcripts: tables of expected edits plus invariants."""

from __future__ import annotations

import re

import pytest

from leyline_policies import (
    Chain,
    Conversation,
    Edit,
    Mode,
    Redact,
    StaleToolDetector,
    TokenBudget,
    TruncateOlderThanN,
    apply_edits,
    available_policies,
    load_policy,
    register,
    run_policies,
)
from tests.policies.transcripts import make_conversation


def conv(messages=None):
    return Conversation.of(messages or make_conversation())


def well_formed(before, after):
    """Same messages, same roles, same tool calls and ids: only contents changed."""
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        assert a["role"] == b["role"]
        assert a.get("tool_calls") == b.get("tool_calls") and a.get("tool_call_id") == b.get("tool_call_id")


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, [3, 4, 6, 8, 10, 12, 14]),  # the final answer (15) makes even the last result one turn old
        (2, [3, 4, 6, 8, 10, 12]),
        (3, [3, 4, 6, 8, 10]),
        (6, [3, 4]),  # the parallel reads of the first turn
        (7, []),
    ],
)
def test_truncate_older_than_n(n, expected):
    edits = TruncateOlderThanN(n).propose(conv())
    assert [e.index for e in edits] == expected
    for e in edits:
        assert e.replacement.startswith("[evicted: ") and e.mode == "amortize" and e.removed_chars > 0
    well_formed(make_conversation(), apply_edits(make_conversation(), edits))


def test_truncate_stub_names_tool_args_and_size_and_is_byte_stable():
    (first, *_) = TruncateOlderThanN(2).propose(conv())
    text = make_conversation()[3]["content"]
    assert first.replacement == f'[evicted: read_file(path="app.py") output, {len(text):,} chars]'
    again = TruncateOlderThanN(2).propose(conv())
    assert again[0].replacement == first.replacement
    # an evicted conversation proposes nothing new for the evicted messages
    evicted = apply_edits(make_conversation(), TruncateOlderThanN(2).propose(conv()))
    assert TruncateOlderThanN(2).propose(conv(evicted)) == []


def test_truncate_excludes_tools_and_validates():
    edits = TruncateOlderThanN(1, exclude_tools={"run"}).propose(conv())
    assert [e.index for e in edits] == [3, 4, 10, 12]
    with pytest.raises(ValueError):
        TruncateOlderThanN(0)


def test_stale_tool_detector_table():
    edits = {e.index: (e.reason, e.kind) for e in StaleToolDetector().propose(conv())}
    assert edits == {
        3: ("invalidated by a later write", "correct"),  # app.py written at 10 (and read again at 12)
        6: ("failed call that was retried", "evict"),  # pytest errored, run again at 8
    }
    with_writes_only = StaleToolDetector(read_tools={"read_file"}, write_tools={"write_file"})
    messages = make_conversation()[:11]  # before the re-read: the write invalidates the read
    assert {e.index: e.reason for e in with_writes_only.propose(conv(messages))} == {
        3: "invalidated by a later write",
        6: "failed call that was retried",
    }
    # a re-read with no write in between supersedes: evicted, its conclusions hold
    reread = make_conversation()[:5] + make_conversation()[11:13]
    (edit,) = StaleToolDetector().propose(conv(reread))
    assert (edit.index, edit.reason, edit.kind, edit.mode) == (3, "superseded by a later read", "evict", "amortize")


def test_stale_duplicates_and_custom_resource_keys():
    messages = make_conversation()[:5] + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "g1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "add"}'}},
                {"id": "g2", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "add"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "g1", "content": "app.py:1"},
        {"role": "tool", "tool_call_id": "g2", "content": "app.py:1"},
    ]
    edits = {e.index: e.reason for e in StaleToolDetector(resource_keys={"grep": "pattern"}).propose(conv(messages))}
    assert edits == {6: "duplicate of a later output"}
    assert StaleToolDetector(exclude_tools={"grep"}).propose(conv(messages)) == []
    with pytest.raises(ValueError):
        StaleToolDetector(read_tools={"x"}, write_tools={"x"})


def test_token_budget_triggers_and_minimum():
    inner = TruncateOlderThanN(2)
    assert TokenBudget(inner, trigger_tokens=10_000).propose(conv()) == []
    assert [e.index for e in TokenBudget(inner, trigger_tokens=10).propose(conv())] == [3, 4, 6, 8, 10, 12]
    assert TokenBudget(inner, trigger_tokens=10, min_freed_tokens=10_000).propose(conv()) == []
    with pytest.raises(ValueError):
        TokenBudget(inner, trigger_tokens=-1)


def test_redact_is_forget():
    messages = make_conversation()
    messages[1] = {"role": "user", "content": "Fix it. My key is sk-abcdef123456 and password=hunter2"}
    (edit,) = Redact([r"sk-[A-Za-z0-9]{8,}", r"password=\S+"]).propose(conv(messages))
    assert edit.index == 1 and edit.mode == "forget"
    assert edit.replacement == "Fix it. My key is [redacted] and [redacted]"
    messages[4] = {**messages[4], "content": "token sk-abcdef123456 in a test file"}
    assert [e.index for e in Redact([r"sk-\w+"]).propose(conv(messages))] == [1, 4]
    assert [e.index for e in Redact([r"sk-\w+"], exclude_tools={"read_file"}).propose(conv(messages))] == [1]
    with pytest.raises(ValueError):
        Redact([])


def test_chain_flattens_merges_and_never_downgrades_forget():
    messages = make_conversation()
    messages[3] = {**messages[3], "content": messages[3]["content"] + " token sk-abcdef123456"}
    redact = Redact([r"sk-\w+"])
    chain = redact | StaleToolDetector() | TruncateOlderThanN(2)
    assert isinstance(chain, Chain) and len(chain.policies) == 3
    edits = {e.index: e for e in chain.propose(conv(messages))}
    # redacted (forget), then found outdated by the detector: its stub, forget kept, kind redact, erratum kept
    assert edits[3].mode == "forget" and edits[3].replacement.startswith("[outdated: read_file")
    assert edits[3].kind == "redact" and edits[3].erratum is not None
    assert edits[4].mode == "amortize" and edits[4].kind == "evict"
    well_formed(messages, apply_edits(messages, list(edits.values())))


def test_functions_are_policies_and_registry_returns_what_it_registers():
    def drop_greetings(conversation):
        return [
            Edit(i, "", reason="greeting", policy="drop_greetings")
            for i, m in enumerate(conversation.messages)
            if m.get("content") == "hi"
        ]

    chain = Chain(drop_greetings, TruncateOlderThanN(6))
    assert [e.index for e in chain.propose(conv(make_conversation() + [{"role": "user", "content": "hi"}]))] == [
        3,
        4,
        16,
    ]

    @register("my_policy")
    class MyPolicy(TruncateOlderThanN):
        pass

    assert MyPolicy is not None and MyPolicy.__name__ == "MyPolicy"
    assert isinstance(load_policy("my_policy", n=3), MyPolicy)
    assert isinstance(load_policy("truncate_older_than_n", n=2), TruncateOlderThanN)
    assert "my_policy" in available_policies()
    with pytest.raises(KeyError, match="unknown policy"):
        load_policy("nope")


def test_policy_names_accept_kebab_case_and_list_canonical_names():
    assert isinstance(load_policy("truncate-older-than-n", n=3), TruncateOlderThanN)
    assert load_policy("truncate-older-than-n", n=3).n == 3
    assert isinstance(load_policy("stale-tool-detector"), StaleToolDetector)
    assert isinstance(load_policy("stale_tool_detector"), StaleToolDetector)

    @register("drop-everything")
    def drop_everything(**_):
        return TruncateOlderThanN(1)

    assert isinstance(load_policy("drop_everything"), TruncateOlderThanN)
    names = available_policies()
    assert {"truncate_older_than_n", "stale_tool_detector", "token_budget", "redact", "drop_everything"} <= set(names)
    assert not any("-" in name for name in names)
    with pytest.raises(KeyError, match="unknown policy 'no-such-policy'"):
        load_policy("no-such-policy")


def test_mode_is_the_sdk_enum_and_strings_are_normalised():
    from leyline_sdk.core.directives import Mode as SdkMode

    assert Mode is SdkMode
    assert Edit(0, "x", "forget").mode is Mode.FORGET
    assert Edit(0, "x").mode is Mode.AMORTIZE
    assert TruncateOlderThanN(2, mode="forget").mode is Mode.FORGET
    assert all(e.mode is Mode.FORGET for e in TruncateOlderThanN(2, mode="forget").propose(conv()))
    assert all(e.mode is Mode.FORGET for e in Redact([r"\d"]).propose(conv()))
    with pytest.raises(ValueError, match="mode must be 'amortize' or 'forget'"):
        Edit(0, "x", "erase")
    with pytest.raises(ValueError, match="mode must be"):
        StaleToolDetector(mode="sometimes")


def test_run_policies_keeps_earlier_edits_sticky_and_reports_only_new_ones():
    messages = make_conversation()[:9]
    effective, edits, report = run_policies(messages, [TruncateOlderThanN(2)])
    assert [c.index for c in report.cleared] == [3, 4]
    # the agent goes on; the earlier stubs stay byte for byte, only new evictions are reported
    longer = make_conversation()
    effective2, edits2, report2 = run_policies(longer, [TruncateOlderThanN(2)], sticky=edits)
    assert [effective2[i]["content"] for i in (3, 4)] == [effective[i]["content"] for i in (3, 4)]
    assert [c.index for c in report2.cleared] == [6, 8, 10, 12]
    assert report2.removed_chars == sum(len(longer[i]["content"]) for i in (6, 8, 10, 12))
    # sticky edits survive even when the policy would no longer propose them
    _, edits3, report3 = run_policies(longer, [], sticky=edits2)
    assert set(edits3) == set(edits2) and report3.cleared == []
    assert not re.search(r"return a - b", str(effective2[3]))
