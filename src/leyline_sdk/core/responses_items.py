"""Responses API items to chat messages and back: one conversion for the server and the SDK.

Input (a string or items) becomes chat messages:

* a message item (easy ``{role, content}`` or typed ``{type: "message", ...}``) becomes a message of
  its role (``developer`` is a system message, as vLLM reads it); its text parts (``input_text``,
  ``output_text``, ``refusal``) are joined by newlines; any other part (images, files, audio) is
  a 400 naming it;
* ``function_call`` items become the ``tool_calls`` of an assistant message (consecutive calls,
  and an assistant message right before them, are one message); a call in a ``namespace`` is the
  function ``namespace.name``;
* ``function_call_output`` becomes a ``tool`` message (text parts joined);
* ``reasoning`` items carry the reasoning of the assistant message after them: the server's own
  ``encrypted_content`` (:func:`seal`: the reasoning text, base64 with a version tag) is read
  back; reasoning it cannot read (another provider's) is dropped, as its summary is not the
  reasoning the model wrote;
* ``item_reference`` is the stored item of that id (the caller's key only);
* an item's ``id``, when given, is a string (a 400 naming it otherwise);
* anything else (hosted tools' calls: ``web_search_call``, ``local_shell_call``, ``custom_tool_call``,
  ``mcp_*``, ``compaction``, ...) is a 400 naming the item: this server runs no hosted tool.

The answer goes back as output items: an optional ``reasoning`` item, a ``message`` with one
``output_text`` part, and one ``function_call`` item per call (:func:`output_items`).
:func:`to_items` turns chat messages back into input items (what the SDK sends after its
policies edited the conversation), :func:`chat_tools` the Responses API's tools into chat tools.
Refusals raise :class:`ItemError` (the server answers them as 400s naming ``param``).

Cost: each distinct ``encrypted_content`` is decoded once per conversion, however many items or
references carry it; with ``max_chars`` the conversion stops with a 400
``context_length_exceeded`` as soon as the messages it built hold more characters than that (an
item referenced a thousand times counts a thousand times), before they are ever rendered.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from leyline_sdk.core.errors import ItemError
from leyline_sdk.core.fallbacks import FallbackCode

__all__ = [
    "ItemError",
    "TEXT_PARTS",
    "chat_tools",
    "item_id",
    "output_items",
    "seal",
    "to_items",
    "to_messages",
    "unseal",
]


TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
_SEAL = "leyline.v1:"


def item_id(prefix: str) -> str:
    """A fresh item id (``msg_…``, ``fc_…``, ``rs_…``)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def seal(reasoning: str) -> str:
    """The ``encrypted_content`` of a reasoning item: the text, base64 with a version tag (not secret)."""
    return _SEAL + base64.b64encode(reasoning.encode()).decode()


def unseal(content: Any) -> str | None:
    """The reasoning text sealed by :func:`seal`, or ``None`` for anything else."""
    if not isinstance(content, str) or not content.startswith(_SEAL):
        return None
    try:
        return base64.b64decode(content[len(_SEAL) :], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _bad(message: str, param: str, code: str = "invalid_request") -> ItemError:
    return ItemError(message, param, code)


def _text(content: Any, param: str) -> str:
    """The text of a message's or an output's content: a string, or text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content must be a string or a list of parts", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in TEXT_PARTS:
            raise _bad(f"content parts of type {kind!r} are not supported: this model takes text only",
                       f"{param}.{j}.type", "unsupported_content")  # fmt: skip
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad("a text part needs a 'text' string", f"{param}.{j}.text")
        texts.append(text)
    return "\n".join(texts)


class _Builder:
    """Chat messages under construction: calls join the assistant message before them."""

    def __init__(self, max_chars: int | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.reasoning: str | None = None  # read from a reasoning item, for the next assistant message
        self.chars, self.max_chars = 0, max_chars
        self._unsealed: dict[str, str | None] = {}  # each sealed text decoded once

    def unseal(self, content: Any) -> str | None:
        """:func:`unseal`, once per distinct text."""
        if not isinstance(content, str):
            return None
        if content not in self._unsealed:
            self._unsealed[content] = unseal(content)
        return self._unsealed[content]

    def count(self, *texts: str | None) -> None:
        """Charge ``texts`` to the character budget (an :class:`ItemError` past it)."""
        self.chars += sum(len(t) for t in texts if t)
        if self.max_chars is not None and self.chars > self.max_chars:
            message = f"the input holds over {self.max_chars} characters, more than the context can hold"
            raise ItemError(message, "input", FallbackCode.CONTEXT_LENGTH.value)

    def _assistant(self) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
            return last
        message: dict[str, Any] = {"role": "assistant", "content": None}
        self.messages.append(message)
        return message

    def message(self, role: str, text: str) -> None:
        out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": text}
        self.count(text)
        if role == "assistant" and self.reasoning is not None:
            self.count(self.reasoning)
            out["reasoning_content"], self.reasoning = self.reasoning, None
        self.messages.append(out)

    def call(self, call_id: str, name: str, arguments: str) -> None:
        message = self._assistant()
        self.count(call_id, name, arguments)
        if self.reasoning is not None and "reasoning_content" not in message:
            self.count(self.reasoning)
            message["reasoning_content"], self.reasoning = self.reasoning, None
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        message.setdefault("tool_calls", []).append(call)

    def output(self, call_id: str, text: str) -> None:
        self.count(call_id, text)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})


def _message_item(builder: _Builder, item: Mapping[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        raise _bad(f"a message's role must be system, developer, user or assistant, not {role!r}", f"{where}.role")
    builder.message(role, _text(item.get("content"), f"{where}.content"))


def _call_item(builder: _Builder, item: Mapping[str, Any], where: str) -> None:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise _bad("a function_call needs call_id, name and arguments (strings)", where)
    namespace = item.get("namespace")
    builder.call(call_id, f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name, arguments)


def _add(builder: _Builder, item: Any, where: str, resolve: Callable[[str], Mapping[str, Any] | None]) -> None:
    if not isinstance(item, Mapping):
        raise _bad("an input item must be an object", where)
    if item.get("id") is not None and not isinstance(item["id"], str):
        raise _bad("an item's id must be a string", f"{where}.id")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _message_item(builder, item, where)
    elif kind == "function_call":
        _call_item(builder, item, where)
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise _bad("a function_call_output needs a call_id", f"{where}.call_id")
        builder.output(call_id, _text(item.get("output", ""), f"{where}.output"))
    elif kind == "reasoning":
        builder.reasoning = builder.unseal(item.get("encrypted_content"))
    elif kind == "item_reference":
        ref = item.get("id")
        found = resolve(ref) if isinstance(ref, str) else None
        if found is None:
            raise ItemError(f"no stored item {ref!r} for this key", f"{where}.id", "item_not_found", 404)
        _add(builder, found, where, lambda _: None)
    else:
        raise _bad(f"input items of type {kind!r} are not supported: this server runs no hosted tool",
                   f"{where}.type", "unsupported_parameter")  # fmt: skip


def to_messages(
    instructions: str | None,
    history: Sequence[Mapping[str, Any]],
    items: Any,
    resolve: Callable[[str], Mapping[str, Any] | None] = lambda _: None,
    max_chars: int | None = None,
) -> list[dict[str, Any]]:
    """The chat messages of a request: ``instructions`` first (a system message), then the
    ``history`` (chat messages of a previous response), then ``items`` (a string: one user message).

    ``max_chars``: the most characters the messages built from ``items`` may hold (see the module
    docstring)."""
    builder = _Builder(max_chars)
    if instructions:
        builder.message("system", instructions)
    builder.messages += [dict(m) for m in history]
    if isinstance(items, str):
        builder.message("user", items)
    elif isinstance(items, list):
        for i, item in enumerate(items):
            _add(builder, item, f"input.{i}", resolve)
    else:
        raise _bad("input must be a string or a list of items", "input")
    if not builder.messages:
        raise _bad("the request has no input", "input")
    return builder.messages


def output_items(message: Mapping[str, Any], reasoning: str | None, include_sealed: bool) -> list[dict[str, Any]]:
    """The answer as output items: reasoning (sealed when asked), the message, the calls."""
    out: list[dict[str, Any]] = []
    if reasoning:
        item: dict[str, Any] = {"type": "reasoning", "id": item_id("rs"), "summary": [], "status": "completed"}
        item["content"] = [{"type": "reasoning_text", "text": reasoning}]
        if include_sealed:
            item["encrypted_content"] = seal(reasoning)
        out.append(item)
    content = message.get("content")
    if content:
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        out.append({"type": "message", "id": item_id("msg"), "status": "completed", "role": "assistant",
                    "content": [part]})  # fmt: skip
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        namespace, _, name = fn["name"].rpartition(".")
        item = {"type": "function_call", "id": item_id("fc"), "call_id": call["id"], "name": name or fn["name"],
                "arguments": fn["arguments"], "status": "completed"}  # fmt: skip
        if namespace:
            item["namespace"] = namespace
        out.append(item)
    return out


def to_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as input items (what :func:`to_messages` reads back into the same messages)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            output = m.get("content") or ""
            out.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": output})
            continue
        if m.get("reasoning_content"):
            out.append({"type": "reasoning", "id": item_id("rs"), "summary": [],
                        "encrypted_content": seal(str(m["reasoning_content"]))})  # fmt: skip
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        if content or not m.get("tool_calls"):
            kind = "output_text" if role == "assistant" else "input_text"
            part = {"type": kind, "text": content or ""}
            out.append({"type": "message", "role": role, "content": [part]})
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            namespace, _, name = str(fn.get("name", "")).rpartition(".")
            item = {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": name,
                "arguments": fn.get("arguments", ""),
            }
            if namespace:
                item["namespace"] = namespace
            out.append(item)
    return out


def _function(tool: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise _bad("a function tool needs a name", f"{where}.name")
    fn: dict[str, Any] = {"name": name, "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    if tool.get("strict") is not None:
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def chat_tools(tools: Sequence[Any] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The Responses API's tools as chat tools, and the ones not offered to the model.

    Function tools keep their schema and ``strict``; a ``namespace`` group's functions become
    ``namespace.name`` functions. Hosted tools (``web_search``, ``file_search``, ``custom``, ...)
    and a namespace's custom tools are not offered: their names come back in the second list.
    """
    out, not_offered = [], []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, Mapping):
            raise _bad("a tool must be an object", f"tools.{i}")
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool, str(tool.get("name")), f"tools.{i}"))
        elif kind == "namespace":
            inner_tools = tool.get("tools") or []
            if not isinstance(inner_tools, list):
                raise _bad("a namespace's tools must be a list", f"tools.{i}.tools")
            for j, inner in enumerate(inner_tools):
                if isinstance(inner, Mapping) and inner.get("type") == "function":
                    out.append(_function(inner, f"{tool.get('name')}.{inner.get('name')}", f"tools.{i}.tools.{j}"))
                else:
                    label = inner.get("name") if isinstance(inner, Mapping) else j
                    not_offered.append(f"{tool.get('name')}.{label}")
        else:
            not_offered.append(str(kind))
    return out, not_offered
