"""Templates that edit history: every explanation checked against an exact re-render (the oracle).

The base is what a server holds after a turn: the previous prompt's full rendering plus the
generated tokens. The new prompt is a fresh full render of the next conversation. Whatever the
template did in between, ``apply(base, D)`` must be a prefix of that render; removals the
template made must be ``amortize`` deletions, anything it changed ``forget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.traces import TOOLS, messages_at, reasoning_agent_trace
from leyline_sdk.core.directives import Directive, Mode, apply, check
from leyline_sdk.explain.templates import Explanation, Source, Transcript, explain, is_removal
from leyline_sdk.explain.turns import decoder_of, explain_client_turn, explain_turn
from leyline_sdk.render.rendering import HFChatTokenizer
from tests.sdk.reasoning_templates import TEMPLATES, DatedChat, answer_text, make_chat

CHATS = {name: make_chat(name) for name in TEMPLATES}


def generated(chat: HFChatTokenizer, messages: list[dict], answer: dict) -> list[int]:
    """The tokens a model emits for ``answer`` after ``messages`` (its text, then ``<|im_end|>``)."""
    return chat.encode(answer_text(chat, messages, answer, TOOLS) + "<|im_end|>")[0]


def _subsequence(short: Sequence, long: Sequence) -> bool:
    rest = iter(long)
    return all(x in rest for x in short)


def removes_pieces(old: list[int], new: Sequence[int], decode) -> bool:
    """``new`` is ``old`` with one or more pieces cut out: close removals merge into one directive."""
    if is_removal(old, new, decode):
        return True
    return len(new) < len(old) and (_subsequence(new, old) or _subsequence(decode(new), decode(old)))


def check_exact(chat: HFChatTokenizer, base: list[int], new: list[int], ex: Explanation) -> list[int]:
    """The oracle: valid directives whose result is a prefix of the exact render; removals amortized."""
    check(ex.directives, len(base))
    result = apply(base, ex.directives)
    assert result == new[: len(result)]
    decode = decoder_of(chat)
    for d, source in zip(ex.directives, ex.sources, strict=True):
        if source is Source.TEMPLATE and d.mode is Mode.AMORTIZE:  # the rule: only removals are amortized
            assert removes_pieces(base[d.start : d.end], d.replacement, decode), d
    return result


def turn(chat: HFChatTokenizer, before: list[dict], answer: dict, after: list[dict], changed=None, mid=None):
    """(base, new render, explanation) of the request after ``before + [answer] + after``."""
    old = chat.render(before, tools=TOOLS)
    base = old.tokens + generated(chat, before, answer)
    new = chat.render(before + [answer] + after, tools=TOOLS)
    unedited = (lambda: mid) if mid is not None else None
    ex = explain_turn(base, old, new, len(before), changed or {}, unedited, decoder_of(chat))
    return base, new, ex


@pytest.mark.parametrize("in_field", [False, True], ids=["think-in-content", "reasoning_content"])
def test_reasoning_stripped_at_a_new_query_is_amortized_and_reprefills_under_5_percent(in_field):
    chat = CHATS["strip"]
    steps = reasoning_agent_trace(turns=12, reasoning_in_field=in_field)
    for t in range(1, 12):
        before = messages_at(steps, t - 1)
        base, new, ex = turn(chat, before, steps[t - 1].answer, steps[t].before)
        result = check_exact(chat, base, new.tokens, ex)
        if steps[t].kind == "tool":  # the template kept everything: the base is a prefix, no directive
            assert ex.directives == [] and new.tokens[: len(base)] == base
            continue
        # every reasoning block of the finished query (5 answers, the generated one included) dropped
        assert len(ex.directives) == 5 and all(d.mode is Mode.AMORTIZE and not d.replacement for d in ex.directives)
        assert ex.count(Source.TEMPLATE) == 5 and ex.fallback is None
        prefilled = len(new.tokens) - len(result)  # the new query and the generation prompt
        assert prefilled <= 0.05 * len(new.tokens), (t, prefilled, len(new.tokens))


def test_policy_edits_on_an_unstable_template_keep_their_mode_and_source():
    chat = CHATS["strip"]
    steps = reasoning_agent_trace(turns=12)
    t = 10  # a new query: the template strips reasoning, and a policy stubs two old tool outputs
    before = messages_at(steps, t - 1)
    after = steps[t].before
    stubbed = [dict(m) for m in before]
    tools_at = [i for i, m in enumerate(before) if m["role"] == "tool"][:2]
    for i in tools_at:
        stubbed[i]["content"] = f"[evicted: read_file output {i}]"
    old = chat.render(before, tools=TOOLS)
    assert not old.prefix_stable
    base = old.tokens + generated(chat, before, steps[t - 1].answer)
    new = chat.render(stubbed + [steps[t - 1].answer] + after, tools=TOOLS)
    mid = chat.render(before + [steps[t - 1].answer] + after, tools=TOOLS).tokens
    changed = {i: (Mode.AMORTIZE, Source.POLICY) for i in tools_at}
    ex = explain_turn(base, old, new, len(before), changed, lambda: mid, decoder_of(chat))
    check_exact(chat, base, new.tokens, ex)
    assert all(d.mode is Mode.AMORTIZE for d in ex.directives) and ex.fallback is None
    assert ex.count(Source.POLICY) == 2 and ex.count(Source.TEMPLATE) == 5
    # a forget edit forgets from its message on, whoever else edited later
    changed = {i: (Mode.FORGET, Source.POLICY) for i in tools_at}
    ex = explain_turn(base, old, new, len(before), changed, lambda: mid, decoder_of(chat))
    check_exact(chat, base, new.tokens, ex)
    assert ex.directives[-1].mode is Mode.FORGET and ex.sources[-1] is Source.POLICY
    assert ex.directives[-1].start <= old.message_spans[tools_at[0]].end


def test_a_changed_date_is_a_changed_fact_forget_from_the_preamble():
    chat = make_chat("date")
    assert isinstance(chat, DatedChat)
    steps = reasoning_agent_trace(turns=3)
    before = messages_at(steps, 1)
    old = chat.render(before, tools=TOOLS)
    base = old.tokens + generated(chat, before, steps[1].answer)
    chat.today = "2 Jan 2026"  # the next request is rendered a day later
    new = chat.render(messages_at(steps, 2), tools=TOOLS)
    ex = explain_turn(base, old, new, len(before), {}, None, decoder_of(chat))
    check_exact(chat, base, new.tokens, ex)
    assert [d.mode for d in ex.directives] == [Mode.FORGET] and ex.sources == [Source.TEMPLATE]
    assert ex.directives[0].start < old.message_spans[0].start  # in the preamble, where the date is


@pytest.mark.parametrize("name", ["counter", "tool"])
def test_a_template_that_changes_an_earlier_message_forgets_from_there(name):
    chat = CHATS[name]
    steps = reasoning_agent_trace(turns=7)
    for t in (3, 5, 6):  # tool turns and a query turn
        before = messages_at(steps, t - 1)
        base, new, ex = turn(chat, before, steps[t - 1].answer, steps[t].before)
        result = check_exact(chat, base, new.tokens, ex)
        # the counter moves with a new query; a tool result changes once the answer after it arrives
        changes = steps[t].kind == "query" if name == "counter" else steps[t - 1].kind == "tool"
        assert any(d.mode is Mode.FORGET for d in ex.directives) == changes, (t, ex)
        if not changes:
            assert result == base


def test_a_generated_answer_unlike_the_recorded_one_is_forgotten_from_where_they_differ():
    chat = CHATS["strip"]
    steps = reasoning_agent_trace(turns=3)
    before = messages_at(steps, 1)
    old = chat.render(before, tools=TOOLS)
    base = old.tokens + chat.encode("something else entirely<|im_end|>")[0]  # the agent recorded its own answer
    new = chat.render(messages_at(steps, 2), tools=TOOLS)
    ex = explain_turn(base, old, new, len(before), {}, None, decoder_of(chat))
    result = check_exact(chat, base, new.tokens, ex)
    assert ex.directives[-1].end == len(base) and len(result) >= len(old.tokens)


def test_the_server_tells_a_plain_clients_edits_from_the_templates():
    chat = CHATS["strip"]
    steps = reasoning_agent_trace(turns=12)
    before, t = messages_at(steps, 9), 10
    base = chat.render(before, tools=TOOLS).tokens + generated(chat, before, steps[9].answer)
    previous = Transcript(before, TOOLS, chat.render(before, tools=TOOLS))
    edited = [dict(m) for m in messages_at(steps, t)]
    edited[3]["content"] = "[evicted]"  # the client stubbed an old tool output itself

    def render_tokens(messages: list[dict[str, Any]], tools: Any) -> list[int]:
        return chat.render(messages, tools=tools).tokens

    current = Transcript(edited, TOOLS, chat.render(edited, tools=TOOLS))
    ex = explain_client_turn(base, previous, current, render_tokens, decoder_of(chat))
    check_exact(chat, base, current.render.tokens, ex)
    assert ex.count(Source.CLIENT) == 1 and ex.count(Source.TEMPLATE) == 5
    assert all(d.mode is Mode.AMORTIZE for d in ex.directives)
    blind = explain_client_turn(base, None, current, render_tokens, decoder_of(chat))  # no transcript kept
    check_exact(chat, base, current.render.tokens, blind)
    assert set(blind.sources) == {Source.CLIENT} and all(d.mode is Mode.AMORTIZE for d in blind.directives)


def test_long_conversations_align_exactly_with_edits_everywhere():
    chat = CHATS["strip"]
    steps = reasoning_agent_trace(turns=60, calls_per_query=9, output_lines=40)
    before = messages_at(steps, 49)
    assert steps[50].kind == "query"
    base, new, ex = turn(chat, before, steps[49].answer, steps[50].before)
    result = check_exact(chat, base, new.tokens, ex)
    assert len(base) > 25_000 and len(ex.directives) == 10 and len(new.tokens) - len(result) < 40


# -- property: any conversation, any template ------------------------------------------------------
words = st.sampled_from(["alpha", "beta", "x = 1", "\n", "日本", "</think>", "<think>", " ", "ok."])
text = st.lists(words, max_size=6).map("".join)


@st.composite
def assistant(draw):
    message: dict[str, Any] = {"role": "assistant"}
    reasoning, content = draw(text), draw(text)
    where = draw(st.sampled_from(["content", "field", "none"]))
    if where == "field":
        message["reasoning_content"], message["content"] = reasoning, content
    else:
        message["content"] = f"<think>\n{reasoning}\n</think>\n\n{content}" if where == "content" else content
    if draw(st.booleans()):
        fn = {"name": "read_file", "arguments": '{"path": "a.py"}'}
        message["tool_calls"] = [{"id": "c", "type": "function", "function": fn}]
    return message


message = st.one_of(
    assistant(),
    st.builds(lambda c: {"role": "user", "content": c}, text),
    st.builds(lambda c: {"role": "tool", "tool_call_id": "c", "content": c}, text),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(TEMPLATES)),
    before=st.lists(message, min_size=1, max_size=6).map(lambda ms: [{"role": "system", "content": "s"}, *ms]),
    answer=assistant(),
    after=st.lists(message, max_size=3),
    generation=st.sampled_from(["exact", "noise", "cut"]),
    edits=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(list(Mode)), text), max_size=2),
)
def test_no_template_behaviour_yields_a_directive_that_misses_the_render(
    name, before, answer, after, generation, edits
):
    chat = make_chat(name) if name == "date" else CHATS[name]
    old = chat.render(before, tools=TOOLS)
    gen = generated(chat, before, answer) if generation != "noise" else [7, 300, 12, 901]
    base = old.tokens + (gen[: len(gen) // 2] if generation == "cut" else gen)
    if name == "date":
        chat.today = "2 Jan 2026"
    edited, changed = [dict(m) for m in before], {}
    for index, mode, content in edits:  # a policy's edits of messages the server has seen
        if index < len(before):
            edited[index]["content"] = content
            if edited[index] != before[index]:
                changed[index] = (mode, Source.POLICY)
            else:  # a later edit restored the message: nothing changed there
                changed.pop(index, None)
    new = chat.render(edited + [answer] + after, tools=TOOLS)
    mid = chat.render(before + [answer] + after, tools=TOOLS).tokens
    ex = explain_turn(base, old, new, len(before), changed, lambda: mid, decoder_of(chat))
    check_exact(chat, base, new.tokens, ex)
    if changed and all(m is Mode.FORGET for m, _ in changed.values()):
        first = min(old.message_spans[i].start for i in changed)
        assert any(d.mode is Mode.FORGET for d in ex.directives if d.start <= old.message_spans[max(changed)].end)
        assert all(d.start < first or d.mode is Mode.FORGET or d.start >= first for d in ex.directives)


def test_explain_exact_mode_and_the_bare_rule():
    base = [1, 2, 3, 4, 5, 6, 7, 8]
    assert explain(base, [1, 2, 5, 6, 7, 8], prefix=False).directives == [
        Directive(start=2, end=4, replacement=(), mode=Mode.AMORTIZE)
    ]
    ex = explain(base, [1, 2, 3, 9, 5, 6, 7, 8], prefix=False)  # a changed token: a changed fact
    assert ex.directives == [Directive(start=3, end=8, replacement=(9, 5, 6, 7, 8), mode=Mode.FORGET)]
    assert is_removal([1, 2, 3], [1, 3]) and not is_removal([1, 2, 3], [1, 4]) and not is_removal([1], [1, 2])
