"""Anthropic's context editing, applied by the server to the conversation before the model sees it.

``context_management.edits`` (applied in the order given; Anthropic asks that thinking come first):

* ``clear_tool_uses_20250919`` — once ``trigger`` is reached (``input_tokens``, default 100,000,
  or ``tool_uses``), the oldest tool results are replaced by :data:`PLACEHOLDER`, all but the
  ``keep`` most recent tool uses (default 3), never those of ``exclude_tools``; with
  ``clear_tool_inputs`` (true, or a list of tool names) the calls' inputs are cleared too
  (``{}``). ``clear_at_least`` (``input_tokens``): nothing is cleared unless at least that many
  tokens would be.
* ``clear_thinking_20251015`` — the reasoning of all but the ``keep`` most recent thinking turns
  (``{"type": "thinking_turns", "value": N}``, default 1, or ``"all"``) is dropped.

The client keeps its full history; the server clears it every turn, from the whole history. A
turn that clears more than the last one is an edit of the conversation the session holds: the
pipeline's conversation recognition finds the session and the edit is spliced under the opt-in
(``X-Leyline-Client-Edits: amortize``), exact otherwise — where Anthropic's docs say clearing
invalidates the cached prefix from the cleared content on. The response reports
``context_management.applied_edits`` as Anthropic does (``cleared_tool_uses``,
``cleared_thinking_turns``, ``cleared_input_tokens``: the tokens of the cleared text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leyline_server.api.errors import APIError

__all__ = ["PLACEHOLDER", "ContextEdits", "apply_context_edits"]

PLACEHOLDER = "[tool result cleared to save context]"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"

Count = Callable[[str], int]  # tokens of a text


@dataclass
class ContextEdits:
    """The conversation after the edits, and what each edit did (``applied_edits``)."""

    messages: list[dict[str, Any]]
    applied: list[dict[str, Any]] = field(default_factory=list)


def _value(spec: Any, kind: str, default: int, where: str) -> int:
    if spec is None:
        return default
    value = spec.get("value") if isinstance(spec, Mapping) and spec.get("type") == kind else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise APIError(400, "invalid_request", f"expected {{'type': '{kind}', 'value': <int, 0 or more>}}", where)
    return value


def _names(value: Any, where: str) -> set[str]:
    """A list of tool names; 400 for anything else."""
    if value is None:
        return set()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise APIError(400, "invalid_request", "expected a list of tool names", where)
    return set(value)


def _inputs(value: Any, where: str) -> bool | set[str]:
    """``clear_tool_inputs``: true (every tool's), false, or the tools' names."""
    return value if isinstance(value, bool) else _names(value, where)


def _tool_uses(messages: list[dict[str, Any]]) -> list[tuple[int, int, str, str]]:
    """Every tool use, oldest first: (assistant index, call index, call id, tool name)."""
    out = []
    for i, m in enumerate(messages):
        for k, call in enumerate(m.get("tool_calls") or () if m.get("role") == "assistant" else ()):
            out.append((i, k, str(call.get("id")), str(call.get("function", {}).get("name"))))
    return out


def _clear_tool_uses(
    messages: list[dict[str, Any]], edit: Mapping[str, Any], prompt_tokens: int, count: Count, where: str
) -> dict[str, Any] | None:
    uses = _tool_uses(messages)
    trigger = edit.get("trigger")
    kind = trigger.get("type") if isinstance(trigger, Mapping) else "input_tokens"
    reached = (
        len(uses) >= _value(trigger, "tool_uses", 0, f"{where}.trigger")
        if kind == "tool_uses"
        else prompt_tokens >= _value(trigger, "input_tokens", 100_000, f"{where}.trigger")
    )
    keep = _value(edit.get("keep"), "tool_uses", 3, f"{where}.keep")
    excluded = _names(edit.get("exclude_tools"), f"{where}.exclude_tools")
    inputs = _inputs(edit.get("clear_tool_inputs"), f"{where}.clear_tool_inputs")
    if not reached:
        return None
    results = {m["tool_call_id"]: j for j, m in enumerate(messages) if m.get("role") == "tool"}
    candidates = [u for u in (uses[:-keep] if keep else uses) if u[3] not in excluded]
    plan, cleared_tokens = [], 0
    for i, k, call_id, name in candidates:
        j = results.get(call_id)
        result = j is not None and messages[j]["content"] != PLACEHOLDER
        if j is not None and result:
            cleared_tokens += max(count(str(messages[j]["content"])) - count(PLACEHOLDER), 0)
        arguments = messages[i]["tool_calls"][k]["function"].get("arguments", "{}")
        clear_input = (inputs is True or (isinstance(inputs, set) and name in inputs)) and arguments != "{}"
        if result or clear_input:  # a use an earlier edit cleared already is not cleared (or counted) again
            plan.append((i, k, j, clear_input))
    least = _value(edit.get("clear_at_least"), "input_tokens", 0, f"{where}.clear_at_least")
    if not plan or cleared_tokens < least:
        return None
    for i, k, j, clear_input in plan:
        if j is not None:
            messages[j] = {**messages[j], "content": PLACEHOLDER}
        if clear_input:
            calls = [dict(c) for c in messages[i]["tool_calls"]]
            arguments = calls[k]["function"].get("arguments", "{}")
            cleared_tokens += max(count(arguments) - count("{}"), 0)
            calls[k] = {**calls[k], "function": {**calls[k]["function"], "arguments": json.dumps({})}}
            messages[i] = {**messages[i], "tool_calls": calls}
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(plan), "cleared_input_tokens": cleared_tokens}


def _clear_thinking(messages: list[dict[str, Any]], edit: Mapping[str, Any], count: Count, where: str) -> Any:
    keep = edit.get("keep") or {"type": "thinking_turns", "value": 1}
    if keep == "all":
        return None
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("reasoning_content")]
    kept = _value(keep, "thinking_turns", 1, f"{where}.keep")
    cleared = turns[:-kept] if kept else turns
    if not cleared:
        return None
    tokens = 0
    for i in cleared:
        tokens += count(str(messages[i]["reasoning_content"]))
        messages[i] = {k: v for k, v in messages[i].items() if k != "reasoning_content"}
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": tokens}


def apply_context_edits(
    messages: list[dict[str, Any]], management: Mapping[str, Any] | None, prompt_tokens: int, count: Count
) -> ContextEdits:
    """``messages`` after ``context_management.edits`` (``prompt_tokens``: the unedited prompt's length)."""
    out = ContextEdits([dict(m) for m in messages])
    edits = (management or {}).get("edits") or []
    if not isinstance(edits, list):
        raise APIError(400, "invalid_request", "context_management.edits must be a list", "context_management.edits")
    for n, edit in enumerate(edits):
        where = f"context_management.edits.{n}"
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if kind == CLEAR_TOOL_USES:
            applied = _clear_tool_uses(out.messages, edit, prompt_tokens, count, where)
        elif kind == CLEAR_THINKING:
            applied = _clear_thinking(out.messages, edit, count, where)
        else:
            raise APIError(400, "unsupported_parameter", f"context edit {kind!r} is not supported", f"{where}.type")
        if applied is not None:
            out.applied.append(applied)
    return out
