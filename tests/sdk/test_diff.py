"""diff_to_directives: exact reproduction of the new tokens, localised to the edited messages."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.render.rendering import RenderedConversation, Span
from tests.sdk.conversations import TOOLS, conversation, edited


def check_diff(chat, old_messages, new_messages, edited_old, tools) -> bool:
    """Exact, never ``forget``, and localised to the edited messages; returns whether localisation was claimed."""
    old = chat.render(old_messages, tools=tools)
    new = chat.render(new_messages, tools=tools)
    directives = diff_to_directives(old, new)
    assert apply(old.tokens, directives) == new.tokens
    assert all(d.mode is Mode.AMORTIZE for d in directives)  # a stable template never falls back
    # Identical messages are interchangeable: deleting, moving or editing one of them may
    # legitimately take another one's tokens. And once an edit makes a copy of existing content
    # ("0" -> "" next to another ""), the edit and a move of a neighbour explain the change
    # equally well, so localisation is only claimed when no content gained a copy (nor does an
    # edited message's old content reappear elsewhere: it may then have been matched there).
    if any(new_messages.count(m) > max(1, old_messages.count(m)) for m in new_messages):
        return False
    moved = (j for i in edited_old for j, m in enumerate(new_messages) if m == old_messages[i] and j != i)
    if any(True for _ in moved):  # an edited message's old content reappears elsewhere
        return False
    twins = {j for j, m in enumerate(old_messages) if old_messages.count(m) > 1}
    allowed = set()
    for i in edited_old | twins:
        allowed.update(range(old.message_spans[i].start, old.message_spans[i].end))
    for d in directives:
        assert set(range(d.start, d.end)) <= allowed, (d, edited_old)
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_diff_reproduces_new_tokens_and_touches_only_edited_messages(chat, data):
    old_messages = data.draw(conversation)
    new_messages, edited_old = data.draw(edited(old_messages))
    check_diff(chat, old_messages, new_messages, edited_old, data.draw(st.sampled_from([None, TOOLS])))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_diff_of_distinct_messages_is_always_localised(chat, data):
    drawn = data.draw(conversation)
    old_messages = [{**m, "content": f"message {i}: {m.get('content') or ''}"} for i, m in enumerate(drawn)]
    new_messages, edited_old = data.draw(edited(old_messages))
    new_messages = [m if m in old_messages else {**m, "content": f"new {j}: {m.get('content')}"}
                    for j, m in enumerate(new_messages)]  # fmt: skip
    assert check_diff(chat, old_messages, new_messages, edited_old, TOOLS)


def test_stub_replacing_tool_output_trims_to_the_content(chat, hf_tokenizer):
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "tool", "tool_call_id": "c", "content": "line\n" * 200},
        {"role": "user", "content": "thanks"},
    ]
    old = chat.render(messages)
    new = chat.render([messages[0], {**messages[1], "content": "[evicted]"}, messages[2]])
    (d,) = diff_to_directives(old, new)
    span = old.message_spans[1]
    assert span.start < d.start and d.end < span.end  # role header and <|im_end|> kept
    assert hf_tokenizer.decode(list(d.replacement)).strip() in "[evicted]"
    assert d.mode is Mode.AMORTIZE


def test_modes_come_from_the_causing_edit(chat):
    messages = [{"role": "user", "content": f"message {i} " * 5} for i in range(4)]
    changed = [dict(m) for m in messages]
    changed[1]["content"] = "stub one"
    changed[3]["content"] = "stub three"
    old, new = chat.render(messages), chat.render(changed)
    ds = diff_to_directives(old, new, modes={3: Mode.FORGET})
    assert [d.mode for d in ds] == [Mode.AMORTIZE, Mode.FORGET]
    inserted = chat.render(messages[:2] + [{"role": "user", "content": "secret"}] + messages[2:])
    ds = diff_to_directives(old, inserted, new_modes={2: Mode.FORGET})
    assert [d.mode for d in ds] == [Mode.FORGET] and ds[0].start == ds[0].end


def test_identical_conversations_need_no_directive(chat):
    messages = [{"role": "user", "content": "hi"}]
    assert diff_to_directives(chat.render(messages), chat.render(messages)) == []


def _conv(tokens, cuts, stable=True):
    spans = [Span(start=a, end=b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return RenderedConversation(tokens=tokens, message_spans=spans, prefix_stable=stable)


def test_unstable_rendering_falls_back_to_forget_from_first_difference():
    old = _conv([1, 2, 3, 4, 5, 6], [0, 3, 6])
    new = _conv([1, 2, 9, 4, 5, 6], [0, 3, 6], stable=False)
    assert diff_to_directives(old, new) == [Directive(start=2, end=6, replacement=[9, 4, 5, 6], mode="forget")]


def test_unexplained_difference_becomes_forget():
    # Cells whose boundaries disagree with their contents still end in an exact result.
    old = _conv([1, 2, 3, 4], [0, 2, 4])
    new = _conv([1, 2, 3, 4, 5], [0, 1, 5])
    ds = diff_to_directives(old, new)
    assert apply(old.tokens, ds) == new.tokens


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 20), max_size=80),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 10), st.lists(st.integers(0, 20), max_size=6)), max_size=4),
    st.lists(st.integers(0, 20), max_size=10),
)
def test_token_sequence_diff_reproduces_new_tokens(old, edits, extension):
    from leyline_sdk.explain.diff import diff_token_sequences

    new = list(old)
    for at, length, replacement in edits:
        at = min(at, len(new))
        new[at : at + length] = replacement
    new += extension
    directives = diff_token_sequences(old, new)
    assert apply(old, directives) == new
    assert all(d.mode is Mode.AMORTIZE for d in directives)
    starts = [d.start for d in directives]
    assert starts == sorted(starts)


def test_token_sequence_diff_localises_a_middle_edit():
    from leyline_sdk.explain.diff import diff_token_sequences

    old = list(range(100))
    new = old[:40] + [500, 501] + old[60:] + [900, 901]
    ds = diff_token_sequences(old, new)
    assert [(d.start, d.end, list(d.replacement)) for d in ds] == [(40, 60, [500, 501]), (100, 100, [900, 901])]
