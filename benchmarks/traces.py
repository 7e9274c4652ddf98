"""A scripted reasoning agent (no model needed) and a chat template that strips old reasoning.

:func:`reasoning_agent_trace` generates a tool-heavy trace of a reasoning agent: each user query
is answered by a loop of requests, each of whose answers carries a ``<think>`` block and either
a tool call (whose output follows) or the final answer (after which the next query follows).
The steps are deterministic, so benchmarks (``bench_reasoning.py``, a replay benchmark) and tests
replay exactly the same conversation.

:data:`REASONING_TEMPLATE` is the project's own ChatML template with the behaviour of Qwen3's,
DeepSeek-R1's and QwQ's: an assistant turn's reasoning — ``reasoning_content`` or a
``<think>…</think>`` block at the start of its content — is rendered only for assistant turns
after the last user query; once a new query arrives, every earlier reasoning block disappears.
:func:`reasoning_tokenizer` installs it on a copy of the tiny tokenizer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["REASONING_TEMPLATE", "TOOLS", "TraceStep", "reasoning_agent_trace", "messages_at", "reasoning_tokenizer"]

REASONING_TEMPLATE = r"""
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
{%- if m['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
{{- '<|im_start|>system\n# Tools\n<tools>\n' -}}
{%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
{{- '</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set content = m['content'] if m['content'] is string else '' -%}
{%- if m['role'] == 'assistant' -%}
{%- set reasoning = '' -%}
{%- if m.get('reasoning_content') is string -%}
{%- set reasoning = m['reasoning_content'] -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > ns.last_query and reasoning.strip('\n') -%}
{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
{%- endif -%}
{{- content -}}
{%- for call in m.get('tool_calls') or [] -%}
{%- set fn = call['function'] if call.get('function') else call -%}
{{- '<tool_call>{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
{{- fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -}}
{{- '}</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},
]
_WORDS = (
    "the config parser reads a key from the file so the value is none when the section is missing "
    "then the handler returns early and the test fails because the default is never applied"
).split()


@dataclass(frozen=True)
class TraceStep:
    """One request: the messages appended before it (``before``) and the answer the agent records."""

    before: list[dict[str, Any]]
    answer: dict[str, Any]
    kind: str  # "query": a new user query precedes it (earlier reasoning is stripped); "tool": a tool output


def _reasoning(rng: random.Random, words: int) -> str:
    lines = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(max(words // 12, 1))]
    return "\n".join(lines)


def _tool_output(query: int, call: int, lines: int) -> str:
    return "\n".join(
        f"def handler_{query}_{call}_{i}(config):\n    return config.get('key_{query}_{call}_{i}')"
        for i in range(lines // 2)
    )


def _answer(rng: random.Random, reasoning: str, text: str, in_field: bool, call: dict[str, Any] | None) -> dict:
    message: dict[str, Any] = {"role": "assistant"}
    if in_field:
        message["reasoning_content"], message["content"] = reasoning, text
    else:
        message["content"] = f"<think>\n{reasoning}\n</think>\n\n{text}"
    if call is not None:
        message["tool_calls"] = [call]
    return message


def reasoning_agent_trace(
    turns: int = 20,
    calls_per_query: int = 4,
    reasoning_words: int = 60,
    output_lines: int = 30,
    reasoning_in_field: bool = False,
    seed: int = 0,
) -> list[TraceStep]:
    """``turns`` requests of a reasoning agent: per query, ``calls_per_query`` tool calls then an answer.

    Reasoning lives in the content (``<think>…</think>``) or, with ``reasoning_in_field``, in
    ``reasoning_content``. Deterministic for a given ``seed``.
    """
    rng = random.Random(seed)
    steps: list[TraceStep] = []
    query, call = 0, 0
    before: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Think, then use the tools."},
        {"role": "user", "content": "Query 0: find where the configuration is parsed and explain the bug."},
    ]
    for _ in range(turns):
        kind = "query" if before[-1]["role"] == "user" else "tool"
        reasoning = _reasoning(rng, reasoning_words)
        if call < calls_per_query:
            cid = f"call_{query}_{call}"
            args = {"path": f"src/mod_{query}_{call}.py"}
            fn = {"name": "read_file", "arguments": json.dumps(args)}
            answer = _answer(rng, reasoning, "", reasoning_in_field, {"id": cid, "type": "function", "function": fn})
            steps.append(TraceStep(before, answer, kind))
            before = [{"role": "tool", "tool_call_id": cid, "content": _tool_output(query, call, output_lines)}]
            call += 1
        else:
            text = f"The bug of query {query}: the default is never applied when the section is missing."
            steps.append(TraceStep(before, _answer(rng, reasoning, text, reasoning_in_field, None), kind))
            query, call = query + 1, 0
            before = [{"role": "user", "content": f"Query {query}: now check module {query} the same way."}]
    return steps


def messages_at(steps: list[TraceStep], turn: int) -> list[dict[str, Any]]:
    """The conversation sent with request ``turn`` (every earlier answer recorded)."""
    out: list[dict[str, Any]] = []
    for step in steps[:turn]:
        out += step.before + [step.answer]
    return out + steps[turn].before


def reasoning_tokenizer(template: str = REASONING_TEMPLATE) -> Any:
    """A copy of the tiny tokenizer with ``template`` as its chat template."""
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    tokenizer.chat_template = template
    return tokenizer
