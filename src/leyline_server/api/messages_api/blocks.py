"""Messages API content blocks to chat messages, and the answer back to blocks.

In (:func:`to_chat_messages`):

* ``system`` (a string or text blocks, joined by blank lines) is the first system message; a
  ``role: "system"`` message inside ``messages`` (Claude Code sends one) is a system message there;
* ``text`` blocks are the message's content (joined by blank lines);
* an assistant's ``tool_use`` blocks are its ``tool_calls`` (``input`` as JSON arguments);
* a user's ``tool_result`` blocks are ``tool`` messages, in order, before the user's own text
  (their content a string or text blocks; ``is_error`` prefixes ``[error] ``);
* ``thinking`` blocks are the assistant's reasoning (the text as given; the ``signature`` this
  server wrote is not checked); ``redacted_thinking`` this server wrote (:func:`seal`) is read
  back, another provider's dropped;
* ``image``, ``document`` and every other block a 400 naming it: this model takes text only.
  ``cache_control`` on any block is accepted and changes nothing (everything is cached).

Out (:func:`answer_blocks`): a ``thinking`` block when the answer has reasoning, a ``text`` block,
one ``tool_use`` block per call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from leyline_sdk.core.responses_items import item_id, seal, unseal
from leyline_server.api.errors import APIError

__all__ = ["to_chat_messages", "chat_tools", "chat_tool_choice", "answer_blocks", "stop_reason"]


def _bad(message: str, param: str) -> APIError:
    return APIError(400, "invalid_request", message, param)


def _texts(content: Any, where: str, allowed: tuple[str, ...] = ("text",)) -> list[tuple[str, Mapping[str, Any]]]:
    """``content`` as ``(type, block)`` pairs (a string: one text block); a 400 for any other type."""
    if isinstance(content, str):
        return [("text", {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of blocks", where)
    out = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind not in allowed:
            what = f"content blocks of type {kind!r} are not supported" + (
                ": this model takes text only" if kind in ("image", "document") else ""
            )
            raise APIError(400, "unsupported_content", what, f"{where}.{j}.type")
        out.append((str(kind), block))
    return out


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad("a text block needs a 'text' string", f"{where}.text")
    return text


def _system(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    texts = [_text_of(b, f"system.{j}") for j, (_, b) in enumerate(_texts(system, "system"))]
    return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise _bad("a tool_result block needs a 'tool_use_id'", f"{where}.tool_use_id")
    content = block.get("content", "")
    parts = _texts(content, f"{where}.content")
    text = "\n\n".join(_text_of(b, f"{where}.content.{k}") for k, (_, b) in enumerate(parts))
    if block.get("is_error"):
        text = "[error] " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    blocks = _texts(content, where, ("text", "tool_result"))
    results = [_tool_result(b, f"{where}.{j}") for j, (kind, b) in enumerate(blocks) if kind == "tool_result"]
    texts = [_text_of(b, f"{where}.{j}") for j, (kind, b) in enumerate(blocks) if kind == "text"]
    return results + ([{"role": "user", "content": "\n\n".join(texts)}] if texts or not results else [])


def _assistant(content: Any, where: str) -> dict[str, Any]:
    blocks = _texts(content, where, ("text", "tool_use", "thinking", "redacted_thinking"))
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts, reasoning, calls = [], [], []
    for j, (kind, block) in enumerate(blocks):
        if kind == "text":
            texts.append(_text_of(block, f"{where}.{j}"))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking" and unseal(block.get("data")) is not None:
            reasoning.append(str(unseal(block.get("data"))))
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _bad("a tool_use block needs an 'id' and a 'name'", f"{where}.{j}")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"],
                                                                              "arguments": arguments}})  # fmt: skip
    if texts:
        message["content"] = "\n\n".join(texts)
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def to_chat_messages(system: Any, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a Messages API request (see the module docstring)."""
    out = _system(system)
    for i, message in enumerate(messages):
        role, where = message.get("role"), f"messages.{i}.content"
        content = message.get("content", "")
        if role == "user":
            out += _user(content, where)
        elif role == "assistant":
            out.append(_assistant(content, where))
        elif role == "system":
            texts = [_text_of(b, f"{where}.{j}") for j, (_, b) in enumerate(_texts(content, where))]
            out.append({"role": "system", "content": "\n\n".join(texts)})
        else:
            raise _bad(f"role must be user, assistant or system, not {role!r}", f"messages.{i}.role")
    if not out:
        raise _bad("the request has no messages", "messages")
    return out


def chat_tools(tools: Sequence[Mapping[str, Any]] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Custom tools as chat function tools, and the server tools not offered (``web_search_…``)."""
    out, not_offered = [], []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            not_offered.append(str(tool.get("name") or kind))
            continue
        if not isinstance(tool.get("name"), str):
            raise _bad("a tool needs a name", f"tools.{i}.name")
        fn: dict[str, Any] = {"name": tool["name"]}  # in the order Anthropic's tools list them
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("input_schema") or {"type": "object"}
        if tool.get("strict") is not None:
            fn["strict"] = tool["strict"]
        out.append({"type": "function", "function": fn})
    return out, not_offered


def chat_tool_choice(choice: Mapping[str, Any] | None, offered: bool) -> tuple[Any, bool | None]:
    """``(tool_choice, parallel_tool_calls)`` of a Messages API ``tool_choice``."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "auto":
        return ("auto" if offered else None), parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise _bad(f"tool_choice type must be auto, any, tool or none, not {kind!r}", "tool_choice.type")


def answer_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The answer's content blocks (see the module docstring)."""
    out: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        out.append({"type": "thinking", "thinking": reasoning, "signature": seal(str(reasoning))})
    if message.get("content") or not message.get("tool_calls"):
        out.append({"type": "text", "text": message.get("content") or ""})
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {}
        block_id = call.get("id") or item_id("toolu")
        out.append({"type": "tool_use", "id": block_id, "name": fn.get("name"), "input": arguments})
    return out


def stop_reason(finish_reason: str, matched: str | None) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat finish reason and the stop string met, if any."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if matched is not None:
        return "stop_sequence", matched
    return "end_turn", None


def drop_volatile_lines(messages: list[dict[str, Any]], prefixes: Sequence[str]) -> int:
    """Drop the system messages' lines that start with one of ``prefixes`` (in place); how many.

    A system message left empty is dropped too. Such lines differ from one conversation to the next
    and mean nothing to the model (Claude Code's attribution line); without them, a new
    conversation's prompt is the last one's tokens at the same positions, reused from the cache.
    """
    dropped = 0
    for message in [m for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str)]:
        lines = message["content"].split("\n")
        kept = [line for line in lines if not line.startswith(tuple(prefixes))]
        if len(kept) < len(lines):
            dropped += len(lines) - len(kept)
            message["content"] = "\n".join(kept).strip("\n")
            if not message["content"]:
                messages.remove(message)
    return dropped
