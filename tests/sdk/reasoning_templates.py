"""Chat templates of our own that edit history the way real families' do, on the tiny tokenizer.

* ``STRIP`` — reasoning models (Qwen3, DeepSeek-R1, QwQ): an assistant turn's reasoning
  (``reasoning_content`` or a leading ``<think>…</think>``) is rendered only after the last
  user query (``benchmarks.traces.REASONING_TEMPLATE``).
* ``KEEP`` — the same, but every turn's reasoning stays (what ``ClearThinking`` is for).
* ``DATE`` — a preamble with today's date (Llama 3.x style); ``DatedChat`` supplies ``today``.
* ``COUNTER`` — the system message shows how many user turns the conversation has (a counter that
  changes an early message whenever a query arrives).
* ``TOOL`` — a tool result renders differently once an assistant turn follows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.traces import REASONING_TEMPLATE
from leyline_sdk.render.rendering import HFChatTokenizer

STRIP = REASONING_TEMPLATE
KEEP = REASONING_TEMPLATE.replace("{%- set ns.last_query = loop.index0 -%}", "")
assert KEEP != STRIP

_CALLS = (
    "{%- for call in m.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call.get('function') else call -%}"
    "{{- '<tool_call>{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' -}}"
    "{{- fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -}}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
)


def _chatml(message_body: str, preamble: str = "") -> str:
    """A ChatML template whose per-message body is ``message_body`` (``m``, ``loop`` and ``content`` in scope)."""
    return (
        preamble + "{%- for m in messages -%}"
        "{%- set content = m['content'] if m['content'] is string else '' -%}" + message_body + "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


_PLAIN = "{{- '<|im_start|>' + m['role'] + '\\n' + content -}}" + _CALLS + "{{- '<|im_end|>\\n' -}}"

DATE = _chatml(_PLAIN, preamble="{{- '<|im_start|>system\\nToday is ' + today + '.<|im_end|>\\n' -}}")

COUNTER = (
    "{%- set ns = namespace(users=0) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.users = ns.users + 1 -%}{%- endif -%}"
    "{%- endfor -%}"
    + _chatml(
        "{%- if m['role'] == 'system' -%}"
        "{{- '<|im_start|>system\\n' + content + '\\nUser turns so far: ' + (ns.users | string) + '<|im_end|>\\n' -}}"
        "{%- else -%}" + _PLAIN + "{%- endif -%}"
    )
)

TOOL = _chatml(
    "{%- if m['role'] == 'tool' -%}"
    "{%- set answered = messages[loop.index0 + 1:] | selectattr('role', 'equalto', 'assistant') | list -%}"
    "{{- '<|im_start|>tool' + (' (answered)' if answered else '') + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}" + _PLAIN + "{%- endif -%}"
)

TEMPLATES = {"strip": STRIP, "date": DATE, "counter": COUNTER, "tool": TOOL}
OTHER_TEMPLATES = {"keep": KEEP}


class DatedChat(HFChatTokenizer):
    """An ``HFChatTokenizer`` that passes ``today`` to the template (set it to move the date)."""

    def __init__(self, tokenizer: Any, today: str = "1 Jan 2026") -> None:
        super().__init__(tokenizer)
        self.today = today

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template's text with ``today`` in scope."""
        rendered, _ = self._render_jinja(
            conversations=[list(messages)],
            tools=list(tools) if tools else None,
            chat_template=self.tokenizer.chat_template,
            add_generation_prompt=add_generation_prompt,
            today=self.today,
            **self.tokenizer.special_tokens_map,
        )
        return str(rendered[0])


def make_chat(name: str) -> HFChatTokenizer:
    """A chat tokenizer over a copy of the tiny tokenizer with template ``name`` installed."""
    from benchmarks.traces import reasoning_tokenizer

    tokenizer = reasoning_tokenizer({**TEMPLATES, **OTHER_TEMPLATES}[name])
    return DatedChat(tokenizer) if name == "date" else HFChatTokenizer(tokenizer)


def answer_text(chat: HFChatTokenizer, messages: list[dict[str, Any]], answer: dict[str, Any], tools: Any) -> str:
    """What a model that "generated" ``answer`` after ``messages`` produced (without ``<|im_end|>``)."""
    text = chat.render_text(messages + [answer], tools, False)
    header = "<|im_start|>assistant\n"
    return text[text.rindex(header) + len(header) :].removesuffix("<|im_end|>\n")
