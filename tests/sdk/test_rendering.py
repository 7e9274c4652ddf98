"""Chat rendering: exact per-message spans, checked against tokenizing each prefix alone."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from leyline_sdk.core.errors import RenderError
from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_sdk.render.tiny_tokenizer import CHAT_TEMPLATE, build_tiny_tokenizer, tiny_tokenizer_path
from tests.sdk.conversations import TOOLS, conversation


def _prefix_tokens(hf, messages, tools):
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False)
    return hf(text, add_special_tokens=False)["input_ids"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversation)
def test_spans_match_prefix_tokenizations(chat, hf_tokenizer, messages):
    for tools in (None, TOOLS):
        rendered = chat.render(messages, tools=tools)
        assert rendered.prefix_stable, rendered.unstable_reason
        assert len(rendered.message_spans) == len(messages)
        head = rendered.tokens[: rendered.message_spans[0].start]
        if tools:
            assert hf_tokenizer.decode(head).startswith("<|im_start|>system\n# Tools\n<tools>")
            assert hf_tokenizer.decode(head).endswith("</tools><|im_end|>\n")
        else:
            assert head == []
        for i in range(len(messages)):
            prefix = _prefix_tokens(hf_tokenizer, messages[: i + 1], tools)
            assert rendered.tokens[: rendered.message_spans[i].end] == prefix
        # the tail is the generation prompt
        tail = rendered.tokens[rendered.tail.start :]
        assert hf_tokenizer.decode(tail) == "<|im_start|>assistant\n"


def test_message_tokens_decode_to_the_message(chat, hf_tokenizer):
    messages = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    ]
    rendered = chat.render(messages, add_generation_prompt=False)
    assert rendered.tail.start == rendered.tail.end == len(rendered.tokens)
    assert hf_tokenizer.decode(rendered.message_tokens(2)) == "<|im_start|>tool\na.py\nb.py<|im_end|>\n"
    assert '<tool_call>{"name": "run", "arguments": {"cmd": "ls"}}</tool_call>' in hf_tokenizer.decode(
        rendered.message_tokens(1)
    )


def test_unstable_template_is_reported_not_guessed(hf_tokenizer):
    import copy

    tok = copy.deepcopy(hf_tokenizer)
    # renders the last message differently from the same message followed by others
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
    )
    rendered = HFChatTokenizer(tok).render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert not rendered.prefix_stable
    assert "message" in rendered.unstable_reason


def test_bad_conversations_raise_render_error(chat):
    with pytest.raises(RenderError):
        chat.render([])
    with pytest.raises(RenderError):
        chat.render([{"content": "no role"}])
    with pytest.raises(RenderError):
        chat.render(["not a message"])


def test_tokenizer_needs_a_chat_template(hf_tokenizer):
    import copy

    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError):
        HFChatTokenizer(tok)


def test_shipped_tokenizer_is_the_deterministic_build(tmp_path):
    built = build_tiny_tokenizer(tmp_path / "tok")
    shipped = tiny_tokenizer_path()
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (built / name).read_bytes() == (shipped / name).read_bytes(), name
    assert (shipped / "chat_template.jinja").read_text() == CHAT_TEMPLATE
