"""Edit kinds, errata and the StaleToolDetector's corrections on realistic transcripts."""

from __future__ import annotations

import json

import pytest

from leyline_policies import (
    Chain,
    Conversation,
    Edit,
    EditKind,
    Erratum,
    Mode,
    Redact,
    StaleToolDetector,
    TruncateOlderThanN,
    correct_field,
    insert_errata,
    pending_tool_calls,
    run_policies,
)
from tests.policies.transcripts import NEW_APP, OLD_APP, call, later_turns, read_write_conversation

READ = 'read_file(path="app.py")'
ERRATUM_NEW_CONTENT = (
    f'The earlier output of {READ} is outdated: write_file(path="app.py") changed it afterwards. '
    f"New content:\n{NEW_APP}"
)
ERRATUM_REREAD = (
    f'The earlier output of {READ} is outdated: write_file(path="app.py") changed it afterwards. '
    f"The later {READ} output shows the current value."
)


def tool_pairs_well_formed(messages):
    """Every assistant's tool calls are answered right after it, by exactly its ids, in order."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or []
        answers = messages[i + 1 : i + 1 + len(calls)]
        assert [a.get("role") for a in answers] == ["tool"] * len(calls), (i, answers)
        assert [a["tool_call_id"] for a in answers] == [c["id"] for c in calls]
    assert all(
        m.get("role") != "tool" or messages[i - 1].get("role") in ("tool", "assistant") for i, m in enumerate(messages)
    )


@pytest.mark.parametrize(
    "args, kind, mode",
    [
        ({}, "evict", "amortize"),  # the old default, unchanged
        ({"mode": "forget"}, "redact", "forget"),  # an old forget edit reads as redact
        ({"kind": "evict"}, "evict", "amortize"),
        ({"kind": "evict", "mode": "forget"}, "evict", "forget"),  # TruncateOlderThanN(mode="forget")
        ({"kind": "redact"}, "redact", "forget"),
        ({"kind": "correct"}, "correct", "forget"),
        ({"kind": "correct", "erratum": "x changed"}, "correct", "amortize"),
        ({"erratum": "x changed"}, "correct", "amortize"),
        ({"kind": "correct", "erratum": "x changed", "mode": "forget"}, "correct", "forget"),
    ],
)
def test_edit_kind_and_mode_derive_from_each_other(args, kind, mode):
    edit = Edit(0, "x", **args)
    assert (edit.kind, edit.mode) == (EditKind(kind), Mode(mode))
    assert isinstance(edit.kind, EditKind) and isinstance(edit.mode, Mode)


@pytest.mark.parametrize(
    "args, words",
    [
        ({"kind": "redact", "mode": "amortize"}, "a redact edit must be 'forget'"),
        ({"kind": "correct", "mode": "amortize"}, "a correct edit needs mode 'forget' or an erratum"),
        ({"kind": "evict", "erratum": "x"}, "an erratum belongs to a 'correct'"),
        ({"kind": "erase"}, "kind must be 'evict', 'redact' or 'correct'"),
        ({"mode": "erase"}, "mode must be 'amortize' or 'forget'"),
        ({"erratum": "  "}, "an erratum needs a non-empty text"),
    ],
)
def test_contradictory_edits_are_refused(args, words):
    with pytest.raises(ValueError, match=words):
        Edit(0, "x", **args)


def test_an_edit_needs_content_or_an_erratum():
    with pytest.raises(ValueError, match="a replacement, an erratum, or both"):
        Edit(0, None)
    assert Edit(0, None, erratum="e").replacement is None
    assert Edit(0, None, erratum="e").erratum == Erratum("e")


def test_erratum_message_is_a_marked_user_message():
    assert Erratum("a changed").message() == {"role": "user", "content": "[erratum] a changed"}
    assert Erratum("a changed", role="system").message()["role"] == "system"


@pytest.mark.parametrize("reread", [False, True], ids=["read-write", "read-write-reread"])
def test_invalidated_read_gets_an_erratum_by_default(reread):
    (edit,) = StaleToolDetector().propose(Conversation.of(read_write_conversation(reread)))
    assert (edit.index, edit.kind, edit.mode, edit.reason) == (3, "correct", "amortize", "invalidated by a later write")
    if reread:  # the new value is in view: the old output is evicted too, and the erratum points there
        assert edit.replacement == f"[outdated: {READ} output, {len(OLD_APP)} chars; changed later by write_file]"
        assert edit.erratum == Erratum(ERRATUM_REREAD)
    else:  # the old output stays (nothing invalidated); the erratum carries the write's content
        assert edit.replacement is None and edit.removed_chars == 0
        assert edit.erratum == Erratum(ERRATUM_NEW_CONTENT)


@pytest.mark.parametrize("reread", [False, True], ids=["read-write", "read-write-reread"])
def test_invalidated_read_forget_and_evict_strategies(reread):
    conv = Conversation.of(read_write_conversation(reread))
    (forget,) = StaleToolDetector(on_invalidated="forget").propose(conv)
    stub = f"[outdated: {READ} output, {len(OLD_APP)} chars; changed later by write_file]"
    assert (forget.index, forget.replacement, forget.kind, forget.mode) == (3, stub, "correct", "forget")
    assert forget.erratum is None and forget.removed_chars == len(OLD_APP)
    (evict,) = StaleToolDetector(on_invalidated="evict").propose(conv)
    assert evict.replacement == f"[stale: {READ} output, {len(OLD_APP)} chars]"
    assert (evict.kind, evict.mode, evict.reason) == ("evict", "amortize", "invalidated by a later write")
    with pytest.raises(ValueError, match="on_invalidated must be"):
        StaleToolDetector(on_invalidated="ignore")


def test_status_flip_erratum_quotes_the_write_and_its_output():
    messages = [
        {"role": "user", "content": "Is ticket 7 still open?"},
        {"role": "assistant", "content": None, "tool_calls": [call("g", "get_ticket", id=7)]},
        {"role": "tool", "tool_call_id": "g", "content": json.dumps({"id": 7, "status": "open"})},
        {"role": "assistant", "content": None, "tool_calls": [call("u", "update_ticket", id=7, status="closed")]},
        {"role": "tool", "tool_call_id": "u", "content": "ok"},
    ]
    keys = {"get_ticket": "id", "update_ticket": "id"}
    detector = StaleToolDetector(read_tools={"get_ticket"}, write_tools={"update_ticket"}, resource_keys=keys)
    (edit,) = detector.propose(Conversation.of(messages))
    assert edit.index == 2 and edit.erratum is not None
    assert edit.erratum.text == (
        'The earlier output of get_ticket(id=7) is outdated: update_ticket(id=7, status="closed") changed it '
        "afterwards. update_ticket returned:\nok"
    )


def test_erratum_text_is_kept_when_what_it_quotes_is_evicted_later():
    keys = {"get_ticket": "id", "update_ticket": "id"}
    detector = StaleToolDetector(read_tools={"get_ticket"}, write_tools={"update_ticket"}, resource_keys=keys)
    history = [
        {"role": "user", "content": "Close ticket 7 if it is open."},
        {"role": "assistant", "content": None, "tool_calls": [call("g", "get_ticket", id=7)]},
        {"role": "tool", "tool_call_id": "g", "content": json.dumps({"id": 7, "status": "open"})},
        {"role": "assistant", "content": None, "tool_calls": [call("u", "update_ticket", id=7, status="closed")]},
        {"role": "tool", "tool_call_id": "u", "content": "ok"},
    ]
    policies = [detector, TruncateOlderThanN(1)]
    effective, sticky, _ = run_policies(history, policies)
    first = effective[5]
    assert first["content"].endswith("update_ticket returned:\nok")
    history = history + later_turns(1, 2)
    effective, sticky, report = run_policies(history, policies, sticky=sticky)
    assert effective[4]["content"].startswith("[evicted: update_ticket")  # the quoted output is gone now
    fresh = detector.propose(Conversation.of(effective[:5] + effective[6:]))  # what it would write today
    assert fresh[0].erratum is not None and not fresh[0].erratum.text.endswith("ok")
    assert effective[5] == first and report.errata == []  # the erratum issued then stays, byte for byte


def test_failed_write_changes_nothing_and_long_content_is_pointed_to():
    messages = read_write_conversation()
    messages[5] = {**messages[5], "content": "Error: permission denied"}
    assert StaleToolDetector().propose(Conversation.of(messages)) == []
    messages = read_write_conversation()
    (edit,) = StaleToolDetector(max_value_chars=10).propose(Conversation.of(messages))
    assert edit.erratum is not None and edit.erratum.text.endswith(
        f"The new content ({len(NEW_APP)} chars) is in the arguments of that write_file call."
    )


def test_erratum_is_appended_at_the_end_and_keeps_tool_pairs():
    messages = read_write_conversation()
    effective, edits, report = run_policies(messages, [StaleToolDetector()])
    assert effective[:-1] == messages  # nothing rewritten: the prefix stays aligned
    assert effective[-1] == {"role": "user", "content": "[erratum] " + ERRATUM_NEW_CONTENT}
    assert edits[3].erratum is not None and (edits[3].erratum.anchor, edits[3].erratum.seq) == (5, 1)
    assert report.errata == [ERRATUM_NEW_CONTENT] and report.cleared[0].kind == "correct"
    assert report.modes() == {3: Mode.AMORTIZE}
    tool_pairs_well_formed(effective)


def test_erratum_waits_while_tool_calls_are_pending():
    messages = read_write_conversation()
    pending = messages + [{"role": "assistant", "content": None, "tool_calls": [call("c9", "run", cmd="pytest")]}]
    assert pending_tool_calls(pending) and not pending_tool_calls(messages)
    effective, edits, report = run_policies(pending, [StaleToolDetector()])
    assert effective == pending and edits == {} and report.cleared == []  # never between a call and its result
    answered = pending + [{"role": "tool", "tool_call_id": "c9", "content": "1 passed"}]
    effective, edits, _ = run_policies(answered, [StaleToolDetector()], sticky=edits)
    assert effective[-1]["content"].startswith("[erratum] ") and len(effective) == len(answered) + 1
    tool_pairs_well_formed(effective)


@pytest.mark.parametrize(
    "policies",
    [[StaleToolDetector()], [StaleToolDetector(), TruncateOlderThanN(1)]],
    ids=["detector", "detector+truncate"],
)
def test_erratum_is_byte_stable_across_turns(policies):
    history = read_write_conversation()
    effective, sticky, _ = run_policies(history, policies)
    erratum_at = len(history)
    first = effective[erratum_at]
    assert first["content"] == "[erratum] " + ERRATUM_NEW_CONTENT
    previous = effective
    for turn in range(1, 5):
        history = history + later_turns(turn, 1)
        effective, sticky, report = run_policies(history, policies, sticky=sticky)
        assert effective[erratum_at] == first  # same place, same bytes
        assert report.errata == []  # issued once
        tool_pairs_well_formed(effective)
        if len(policies) == 1:  # nothing else changes: each turn's view is a prefix of the next one's
            assert effective[: len(previous)] == previous
        previous = effective
    if len(policies) == 2:  # the write's output and the read were evicted since; the erratum did not move
        assert effective[5]["content"].startswith("[evicted: write_file")
        assert effective[3]["content"].startswith("[evicted: read_file")


def test_an_already_evicted_read_still_gets_its_correction():
    history = read_write_conversation()[:4] + later_turns(1, 2)  # the read, then two more turns
    effective, sticky, _ = run_policies(history, [TruncateOlderThanN(1)])
    assert effective[3]["content"].startswith("[evicted: read_file")  # amortize: its notes stay
    write = read_write_conversation()[4:6]
    history = history + write
    policies = [StaleToolDetector(), TruncateOlderThanN(1)]
    effective, sticky, report = run_policies(history, policies, sticky=sticky)
    assert sticky[3].replacement == effective[3]["content"]  # the stub did not change
    assert sticky[3].kind == "correct" and sticky[3].mode == "amortize"
    assert effective[-1]["content"] == "[erratum] " + ERRATUM_NEW_CONTENT
    # the forget strategy recomputes from the evicted read on instead, keeping its original size
    _, sticky_f, _ = run_policies(history[:-2], [TruncateOlderThanN(1)])
    _, forget, _ = run_policies(history, [StaleToolDetector(on_invalidated="forget")], sticky=sticky_f)
    assert forget[3].mode == "forget" and forget[3].replacement == (
        f"[outdated: {READ} output, {len(OLD_APP)} chars; changed later by write_file]"
    )


def test_chain_keeps_the_erratum_when_another_policy_evicts_the_same_output():
    messages = read_write_conversation() + later_turns(1, 2)
    chain = Chain(StaleToolDetector(), TruncateOlderThanN(1))
    edits = {e.index: e for e in chain.propose(Conversation.of(messages))}
    assert edits[3].replacement.startswith("[evicted: read_file") and edits[3].erratum is not None
    assert (edits[3].kind, edits[3].mode) == ("correct", "amortize")


def test_report_modes_follow_messages_shifted_by_errata():
    history = read_write_conversation()
    _, sticky, _ = run_policies(history, [StaleToolDetector()])
    history = history + [{"role": "user", "content": "my key is sk-abcdef123456"}]
    policies = [Redact([r"sk-\w+"]), StaleToolDetector()]
    effective, _, report = run_policies(history, policies, sticky=sticky)
    (item,) = report.cleared
    assert (item.index, item.effective_index, item.kind) == (6, 7, "redact")
    assert report.modes() == {7: Mode.FORGET} and effective[7]["content"] == "my key is [redacted]"
    assert effective[6]["content"].startswith("[erratum] ")


def test_correct_field_forget_and_erratum():
    messages = [
        {"role": "user", "content": "status?"},
        {"role": "tool", "tool_call_id": "t", "content": '{"id": 7, "status": "open", "owner": "ann"}'},
    ]
    conv = Conversation.of(messages)
    forget = correct_field(conv, 1, '"status": "open"', '"status": "closed"')
    assert forget.replacement == '{"id": 7, "status": "closed", "owner": "ann"}'
    assert (forget.kind, forget.mode) == ("correct", "forget")
    note = correct_field(conv, 1, '"open"', '"closed"', strategy="erratum", role="system")
    assert note.replacement is None and note.mode == "amortize" and note.erratum is not None
    assert note.erratum.message() == {
        "role": "system",
        "content": "[erratum] In an earlier message, '\"open\"' is outdated: the current value is '\"closed\"'.",
    }
    with pytest.raises(ValueError, match="does not contain"):
        correct_field(conv, 1, "closed", "open")
    with pytest.raises(ValueError, match="strategy must be"):
        correct_field(conv, 1, "open", "closed", strategy="rewrite")


def test_insert_errata_orders_by_issue_and_drops_anchors_past_the_end():
    messages = [{"role": "user", "content": str(i)} for i in range(3)]
    errata = [Erratum("b", anchor=1, seq=2), Erratum("a", anchor=1, seq=1), Erratum("c", anchor=7), Erratum("d")]
    effective, positions = insert_errata(messages, errata)
    assert [m["content"] for m in effective] == ["0", "1", "[erratum] a", "[erratum] b", "2"]
    assert positions == [0, 1, 4]
