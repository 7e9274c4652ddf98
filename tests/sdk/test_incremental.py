"""IncrementalRenderer == HFChatTokenizer.render (the oracle: a full render), turn after turn.

Random conversations go through random turns (appends, policy-like stubs anywhere, inserts,
deletes, generation prompt on or off, tools changing) under the project's template and under
templates that are unstable in different ways; every incremental result must equal a fresh full
render exactly: tokens, spans, ``prefix_stable`` and ``unstable_reason``.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_diff import tool_heavy_conversation
from leyline_sdk.render.incremental import IncrementalRenderer
from leyline_sdk.render.rendering import HFChatTokenizer
from tests.sdk.conversations import TOOLS, conversation, edited, message

# the last message gets " (latest)" when it is the user's: stable until a message follows it
LATEST_USER = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.last and m['role'] == 'user' %} (latest){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the first message shows the conversation's length: earlier text changes every turn
COUNTED = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{% if loop.first %} ({{ messages|length }}){% endif %}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
# no special tokens between messages: tokens may straddle message boundaries
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
# consecutive tool results share one block (Qwen style): a message's text depends on the next one
GROUPED = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user\n{% endif %}"
    "<tool_response>{{ m['content'] }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_template(hf_tokenizer, template: str | None) -> HFChatTokenizer:
    """A renderer over a private copy of the tokenizer (the fixture's is shared)."""
    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = template or tok.chat_template
    return HFChatTokenizer(tok)


def assert_same(result, full) -> None:
    assert result.tokens == full.tokens
    assert result.message_spans == full.message_spans
    assert (result.prefix_stable, result.unstable_reason) == (full.prefix_stable, full.unstable_reason)


@st.composite
def turns(draw, start):
    """A few successive conversations: each step appends, stubs, or applies random edits."""
    out, current = [], start
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["append", "stub", "edit", "same"]))
        if kind == "append":
            current = current + draw(st.lists(message(), min_size=1, max_size=3))
        elif kind == "stub":
            k = draw(st.integers(0, len(current) - 1))
            current = [*current[:k], {**current[k], "content": f"[evicted: {k}]"}, *current[k + 1 :]]
        elif kind == "edit":
            current = draw(edited(current))[0] or current
        out.append((current, draw(st.booleans())))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_incremental_equals_full_render_on_the_project_template(chat, data):
    first = data.draw(conversation)
    tools = data.draw(st.sampled_from([None, TOOLS]))
    renderer = IncrementalRenderer(chat)
    assert_same(renderer.render(first, tools=tools), chat.render(first, tools=tools))
    steps = data.draw(turns(first))
    for messages, gen in steps:
        assert_same(renderer.render(messages, tools, gen), chat.render(messages, tools, gen))
    # the template is stable and delimited by special tokens: never a second full render
    assert renderer.full_renders == 1 and renderer.incremental_renders == len(steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_incremental_equals_full_render_on_unstable_templates(hf_tokenizer, data):
    template = data.draw(st.sampled_from([LATEST_USER, COUNTED, PLAIN, GROUPED]))
    chat = with_template(hf_tokenizer, template)
    renderer = IncrementalRenderer(chat)
    first = data.draw(conversation)
    assert_same(renderer.render(first), chat.render(first))
    for messages, gen in data.draw(turns(first)):
        tools = data.draw(st.sampled_from([None, TOOLS]))  # a change of tools renders in full
        assert_same(renderer.render(messages, tools, gen), chat.render(messages, tools, gen))


def test_template_changed_between_turns_falls_back_to_a_full_render(hf_tokenizer):
    chat = with_template(hf_tokenizer, None)
    renderer = IncrementalRenderer(chat)
    messages = [{"role": "user", "content": "read a.py"}, {"role": "assistant", "content": "done"}]
    renderer.render(messages)
    chat.tokenizer.chat_template = chat.tokenizer.chat_template.replace(
        "<|im_start|>{{ message['role'] }}\n", "<|im_start|>{{ message['role'] }}:\n"
    )
    longer = messages + [{"role": "user", "content": "next"}]
    assert_same(renderer.render(longer), chat.render(longer))
    assert renderer.full_renders == 2 and renderer.incremental_renders == 0


def test_long_conversation_with_an_edit_in_the_middle_and_a_new_turn(chat):
    tools = TOOLS[:1]
    messages = tool_heavy_conversation(120)
    renderer = IncrementalRenderer(chat)
    renderer.render(messages, tools)
    edited_messages = list(messages) + [{"role": "user", "content": "and now?"}]
    for k in (3, 59, 115):  # tool outputs early, in the middle, near the end
        assert edited_messages[k]["role"] == "tool"
        edited_messages[k] = {**edited_messages[k], "content": f"[evicted: read_file output {k}]"}
    result = renderer.render(edited_messages, tools)
    assert_same(result, chat.render(edited_messages, tools))
    assert renderer.full_renders == 1 and renderer.incremental_renders == 1


def test_a_template_unstable_only_sometimes_takes_both_paths(hf_tokenizer):
    chat = with_template(hf_tokenizer, LATEST_USER)
    renderer = IncrementalRenderer(chat)
    messages = [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": "hello"}]
    renderer.render(messages)
    messages = messages + [{"role": "user", "content": "hi"}]  # the new last message carries " (latest)"
    assert_same(renderer.render(messages), chat.render(messages))
    assert (renderer.full_renders, renderer.incremental_renders) == (1, 1)
    messages = messages + [{"role": "assistant", "content": "yes"}]  # now the user's text changed
    result = renderer.render(messages)
    assert_same(result, chat.render(messages))
    assert not result.prefix_stable and renderer.full_renders == 2 and renderer.snapshot is None
