"""Templates without tool syntax: OpenAI's tool shapes rendered as byte-stable text, parsed back."""

from __future__ import annotations

import json

import jinja2
import pytest

from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_sdk.render.tool_text import call_block
from leyline_server.api.toolcalls import parse_tool_calls

# SmolLM2-Instruct's template, as shipped in its GGUF: no tools, content must be a string
PLAIN_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def call(i: int, path: str) -> dict:
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
    }


CONVERSATION = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": None, "tool_calls": [call(0, "a.py")]},
    {"role": "tool", "tool_call_id": "c0", "content": "print(1)"},
    {"role": "assistant", "content": "Now b.", "tool_calls": [call(1, "b.py"), call(2, "c.py")]},
    {"role": "tool", "tool_call_id": "c1", "content": "print(2)"},
    {"role": "tool", "tool_call_id": "c2", "content": "print(3)"},
]


@pytest.fixture(scope="module")
def plain_chat() -> HFChatTokenizer:
    tokenizer = load_tiny_tokenizer()
    tokenizer.chat_template = PLAIN_TEMPLATE
    return HFChatTokenizer(tokenizer)


def test_the_template_alone_fails_on_tool_calls_and_the_text_form_renders_them(plain_chat):
    assert not plain_chat.tool_support.native and plain_chat.tool_support.tool_role
    with pytest.raises(jinja2.TemplateError):  # what users hit before: no content on a tool-call message
        plain_chat.tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    text = plain_chat.render_text(CONVERSATION, TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "read_file"' in text
    assert text.count("<tool_call>") == 4  # the instruction's example and the three calls
    assert '{"name": "read_file", "arguments": {"path": "c.py"}}' in text


def test_the_text_form_is_prefix_stable_and_byte_stable(plain_chat):
    for n in range(1, len(CONVERSATION) + 1):
        rendered = plain_chat.render(CONVERSATION[:n], tools=TOOLS, add_generation_prompt=False)
        assert rendered.prefix_stable, rendered.unstable_reason
        longer = plain_chat.render(CONVERSATION, tools=TOOLS, add_generation_prompt=False)
        assert longer.tokens[: len(rendered.tokens)] == rendered.tokens  # earlier turns never change
    assert plain_chat.render_text(CONVERSATION, TOOLS) == plain_chat.render_text(list(CONVERSATION), list(TOOLS))


def test_a_system_message_receives_the_tools_block(plain_chat):
    text = plain_chat.render_text([{"role": "system", "content": "Be brief."}, *CONVERSATION[:1]], TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and text.count("<|im_start|>system") == 1


def test_calls_in_the_text_form_parse_back_into_the_same_calls():
    for c in (call(0, "a.py"), {"id": "x", "type": "function", "function": {"name": "run", "arguments": "{}"}}):
        content, calls = parse_tool_calls("Let me look.\n" + call_block(c))
        assert content.strip() == "Let me look." and len(calls) == 1
        fn = calls[0]["function"]
        assert fn["name"] == c["function"]["name"] and json.loads(fn["arguments"]) == json.loads(
            c["function"]["arguments"]
        )


def test_a_template_with_tool_syntax_is_left_alone(chat):
    assert chat.tool_support.native
    expected = chat.tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert chat.render_text(CONVERSATION, TOOLS) == expected
