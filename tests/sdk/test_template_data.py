"""Renders inside ``prepared_once`` (messages prepared once) == transformers' own renderer, exactly.

The oracle is the same ``HFChatTokenizer`` outside the block, which calls transformers'
``render_jinja_template`` for every render, and for whole conversations
``tokenizer.apply_chat_template(tokenize=False)`` itself. Every prefix of random conversations is
rendered twice in one block (the second time from the prepared messages), with and without
tools and the generation prompt, under the project's template, the test templates that depend on
neighbouring messages, and a reasoning template fed every name a reasoning field goes by.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leyline_sdk.render.rendering import HFChatTokenizer, normalize_messages
from tests.sdk.conversations import TOOLS, conversation
from tests.sdk.reasoning_templates import KEEP, STRIP
from tests.sdk.test_incremental import COUNTED, GROUPED, LATEST_USER, PLAIN

TEMPLATES = {"project": None, "latest": LATEST_USER, "counted": COUNTED, "plain": PLAIN, "grouped": GROUPED}
TEMPLATES |= {"strip": STRIP, "keep": KEEP}
REASONING_NAMES = ("reasoning_content", "thinking", "reasoning")


def renderer(hf_tokenizer, name: str) -> HFChatTokenizer:
    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = TEMPLATES[name] or tok.chat_template
    return HFChatTokenizer(tok)


RENDERERS: dict[str, HFChatTokenizer] = {}


def cached_renderer(hf_tokenizer, name: str) -> HFChatTokenizer:
    if name not in RENDERERS:
        RENDERERS[name] = renderer(hf_tokenizer, name)
    return RENDERERS[name]


@st.composite
def with_reasoning(draw, messages):
    """Give some assistant messages reasoning under one of its names (transformers aliases them)."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and draw(st.booleans()):
            m = {**m, draw(st.sampled_from(REASONING_NAMES)): draw(st.sampled_from(["step 1", "", "hm\nok"]))}
        out.append(m)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prepared_renders_equal_transformers_renders(hf_tokenizer, data):
    name = data.draw(st.sampled_from(sorted(TEMPLATES)))
    chat = cached_renderer(hf_tokenizer, name)
    msgs = normalize_messages(data.draw(conversation.flatmap(with_reasoning)))
    tools = data.draw(st.sampled_from([None, TOOLS]))
    gen = data.draw(st.booleans())
    expected = [chat.render_text(msgs[:i], tools, gen and i == len(msgs)) for i in range(len(msgs) + 1)]
    with chat.prepared_once():
        for _ in range(2):  # the second pass renders from prepared messages only
            got = [chat.render_text(msgs[:i], tools, gen and i == len(msgs)) for i in range(len(msgs) + 1)]
            assert got == expected
    if chat.tool_support.native:  # the text form rewrites messages first: apply_chat_template would not
        whole = chat.tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)
        assert expected[-1] == whole


def test_a_changed_message_outside_the_block_is_rendered_anew(chat):
    msgs = normalize_messages([{"role": "user", "content": "one"}])
    with chat.prepared_once():
        first = chat.render_text(msgs)
    msgs[0]["content"] = "two"  # allowed outside the block: the next block starts from nothing
    with chat.prepared_once():
        assert chat.render_text(msgs) == first.replace("one", "two") != first


def test_template_kwargs_named_like_renderer_arguments_take_transformers_path(chat):
    """``continue_final_message`` is an argument of transformers' renderer, not a template variable."""
    msgs = normalize_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hel"}])
    continued = chat.with_template_kwargs({"continue_final_message": True})
    expected = continued.render_text(msgs, None, False)
    with continued.prepared_once():
        assert continued.render_text(msgs, None, False) == expected
    assert expected.endswith("hel")
