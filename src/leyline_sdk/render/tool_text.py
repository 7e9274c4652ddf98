"""Tool calls as text, for chat templates that have no tool syntax (SmolLM2's, for one).

Such a template ignores ``tools=`` and fails on OpenAI's tool-call message shape (an assistant
message with ``content: null`` and ``tool_calls``). Before rendering, :func:`to_text_form`
rewrites the conversation into plain messages, byte-stably (the same input always gives the same
text, so the prefix cache and the per-message diff keep working):

* the tool definitions go into a ``# Tools`` block at the end of the first system message (a
  system message holding only that block is prepended when there is none)::

      # Tools

      You may call one or more functions. The available functions:
      <tools>
      {"function": {"name": "read_file", ...}, "type": "function"}
      </tools>

      To call a function, answer with one JSON object per call:
      <tool_call>
      {"name": "<function name>", "arguments": {<arguments>}}
      </tool_call>

* an assistant message's tool calls are appended to its content, one ``<tool_call>`` block
  each (``{"name": ..., "arguments": {...}}``, arguments parsed from their JSON string);
* a tool result keeps the ``tool`` role when the template renders unknown roles, and becomes a
  ``user`` message ``<tool_response>\\n...\\n</tool_response>`` when it does not;
* ``content: null`` becomes ``""``.

The server parses the model's ``<tool_call>`` blocks back into OpenAI tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ToolSupport",
    "to_text_form",
    "tools_block",
    "call_block",
    "with_object_arguments",
]

_INTRO = "# Tools\n\nYou may call one or more functions. The available functions:\n<tools>\n"
_OUTRO = (
    "\n</tools>\n\nTo call a function, answer with one JSON object per call:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>'
)


@dataclass(frozen=True)
class ToolSupport:
    """What a chat template renders natively: tool definitions, tool calls, the ``tool`` role."""

    definitions: bool
    calls: bool
    tool_role: bool
    object_arguments: bool = False  # the template JSON-encodes a call's arguments: give it an object, not text

    @property
    def native(self) -> bool:
        """Whether the template handles OpenAI's tool shapes itself."""
        return self.definitions and self.calls and self.tool_role


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True)


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The ``# Tools`` block listing ``tools`` (one JSON object per line)."""
    return _INTRO + "\n".join(_dumps(dict(t)) for t in tools) + _OUTRO


def call_block(call: Mapping[str, Any]) -> str:
    """One ``<tool_call>`` block for an OpenAI tool call."""
    fn = call.get("function") or {}
    args: Any = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the string it is
    payload = json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
    return "<tool_call>\n" + payload + "\n</tool_call>"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))


def _message(message: Mapping[str, Any], support: ToolSupport) -> dict[str, Any]:
    role = message.get("role")
    out = {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id", "name")}
    content = _text(message.get("content"))
    if role == "assistant" and message.get("tool_calls") and not support.calls:
        calls = message["tool_calls"]
        if not isinstance(calls, list | tuple) or not all(isinstance(c, Mapping) for c in calls):
            raise ValueError("'tool_calls' must be a list of tool call objects")
        blocks = "\n".join(call_block(c) for c in calls)
        content = f"{content}\n{blocks}" if content else blocks
    if role == "tool" and not support.tool_role:
        out["role"] = "user"
        content = f"<tool_response>\n{content}\n</tool_response>"
    out["content"] = content
    return out


def to_text_form(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, support: ToolSupport
) -> list[dict[str, Any]]:
    """``messages`` rewritten for a template without (some of) the tool syntax; see the module docstring.

    The result has one message per input message, plus a leading system message holding the
    tools block when tools are given, the template cannot list them and there is no system
    message to put them in.
    """
    out = [_message(m, support) for m in messages]
    if tools and not support.definitions:
        block = tools_block(tools)
        if out and out[0].get("role") == "system":
            first = out[0]["content"]
            out[0] = {**out[0], "content": f"{first}\n\n{block}" if first else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def with_object_arguments(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` with each call's ``arguments`` text parsed into the object it holds (``message`` itself if none).

    OpenAI sends arguments as JSON text; most templates (Qwen's, Llama 3's, Hermes') write
    ``arguments | tojson`` and expect an object, so text would come out quoted and escaped, a call
    the model never saw in training (vLLM and SGLang parse it the same way). Text that is not a JSON
    object is left as it is.
    """
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(_text_arguments(c) for c in calls):
        return message
    converted = []
    for call in calls:
        if _text_arguments(call):
            fn = dict(call["function"])
            fn["arguments"] = json.loads(fn["arguments"])
            call = {**call, "function": fn}
        converted.append(call)
    return {**message, "tool_calls": converted}


def _text_arguments(call: Any) -> bool:
    """Whether ``call``'s arguments are JSON text of an object."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    args = fn.get("arguments") if isinstance(fn, Mapping) else None
    if not isinstance(args, str) or not args.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(args), dict)
    except ValueError:
        return False
