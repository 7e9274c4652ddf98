"""Which conversation a request continues, after its client edited it: identity marks of replies.

Agents edit their own history — they clear old tool results, trim old messages, summarise — so
"the request extends the conversation we hold" is too strict a test of identity, and "the
request shares an opening with it" too loose (two conversations can open alike). What survives an
edit, and is unique to one conversation, is what the *server* wrote into it: the replies it
generated. A reply's mark is

* its tool-call ids when it called tools (the server makes them up: no two conversations share
  them), else
* a digest of its text (two conversations can share a text reply — a greeting — so a text mark
  can name several; the caller then needs more: an exact prefix, or a hint).

A request continues a conversation when it carries that conversation's **latest** reply; a
request that carries an older reply is a fork and gets a conversation of its own. The server
(:mod:`leyline_server.api.conversations`) and the SDK (``leyline_sdk.client.registry``) both decide
with :func:`reply_mark` and :func:`marks_of`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["reply_mark", "marks_of", "message_text", "is_call_mark", "opening"]


def message_text(content: Any) -> str:
    """The text of a message's ``content`` (a string, or text parts), stripped."""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, Sequence):
        parts = [str(p["text"]) for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        return "".join(parts).strip()
    return ""


def reply_mark(message: Mapping[str, Any]) -> str | None:
    """The identity mark of an assistant message (``None``: nothing to identify it by)."""
    if message.get("role") != "assistant":
        return None
    ids = [c.get("id") for c in message.get("tool_calls") or () if isinstance(c, Mapping) and c.get("id")]
    if ids:
        return "calls:" + ",".join(str(i) for i in ids)
    text = message_text(message.get("content"))
    if not text:
        return None
    return "text:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def is_call_mark(mark: str) -> bool:
    """Whether ``mark`` names tool calls (unique to one conversation) rather than text."""
    return mark.startswith("calls:")


def marks_of(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The marks of every assistant message in ``messages``, in order (those without one left out)."""
    return [m for m in (reply_mark(msg) for msg in messages) if m is not None]


def opening(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages before the first assistant message (what a conversation opened with)."""
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            break
        out.append(m)
    return out
