"""Argument checks for ``create``: clear errors that name the argument, before anything is sent.

Like openai-python, wrong types raise ``TypeError`` and wrong values ``ValueError``; the
message names the argument and, for messages, the index::

    TypeError: messages must be a list of message dicts, got str
    ValueError: messages[2] has no 'role'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["check_model", "check_messages", "check_tools"]


def _type_name(value: object) -> str:
    return type(value).__name__


def _is_list(value: object) -> bool:
    """A list-like of items (any iterable, as openai takes it; not a string, bytes or a dict)."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | bytearray | Mapping)


def check_model(model: object) -> str:
    """``model`` must be a non-empty string."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a string (the model name), got {_type_name(model)}")
    if not model:
        raise ValueError("model is required (an empty string was given)")
    return model


def check_messages(messages: object) -> list[dict[str, Any]]:
    """``messages`` must be a non-empty list (any iterable) of message dicts, each with a string ``role``.

    Returns plain dict copies (pydantic message models are dumped without ``None`` fields).
    """
    if not _is_list(messages):
        raise TypeError(f"messages must be a list of message dicts, got {_type_name(messages)}")
    assert isinstance(messages, Iterable)
    messages = list(messages)
    if not messages:
        raise ValueError("messages must not be empty")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message, BaseModel):
            message = message.model_dump(exclude_none=True)
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {_type_name(message)}")
        role = message.get("role")
        if role is None:
            raise ValueError(f"messages[{i}] has no 'role'")
        if not isinstance(role, str):
            raise TypeError(f"messages[{i}]['role'] must be a string, got {_type_name(role)}")
        out.append(dict(message))
    return out


def check_tools(tools: object) -> list[dict[str, Any]] | None:
    """``tools`` must be ``None`` or a list of tool dicts."""
    if tools is None:
        return None
    if not _is_list(tools):
        raise TypeError(f"tools must be a list of tool dicts, got {_type_name(tools)}")
    assert isinstance(tools, Iterable)
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, BaseModel):
            tool = tool.model_dump(exclude_none=True)
        if not isinstance(tool, Mapping):
            raise TypeError(f"tools[{i}] must be a dict, got {_type_name(tool)}")
        out.append(dict(tool))
    return out
