"""Tool calls as models write them, parsed out of generated text.

A *call object* is ``{"name": <string>, "arguments": <object, or its JSON text>}`` (``"parameters"``
is taken for ``"arguments"``, as Llama-style models write it). Models put it in three forms:

* **tagged** — ``<tool_call>{...}</tool_call>``: the syntax of Qwen/Hermes-style templates and of
  the text form Leyline renders for templates without tool syntax; always a call;
* **fenced** — a Markdown code block whose info string is empty, ``json``, ``tool_call`` or
  ``tool_code`` holding one call object or a list of them (what Qwen2.5-Coder 0.5B and 1.5B write
  although their template asks for tags);
* **wrapped** — ``<tools>{...}</tools>``: the tag the Qwen template puts around its *list* of
  tools, which Qwen2.5-Coder 1.5B sometimes writes around a call instead;
* **bare** — the answer opens with a call object, or a list of them, possibly several in a row.

Fenced, wrapped and bare calls count only when every object in them names an offered tool, so that a JSON
answer that happens to have a ``name`` field stays text; tagged calls always count. What is taken
as a call leaves the content; everything else stays as the model wrote it. The same openings are
what a stream holds back (:mod:`leyline_server.api.callscan`) and what the lazy grammar constrains
(:mod:`leyline_server.structured.toolcall`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection
from typing import Any

__all__ = [
    "parse_tool_calls",
    "unfinished_call_at",
    "call_verdict",
    "CALL_FENCES",
    "TAG_OPEN",
    "TAG_CLOSE",
    "WRAP_OPEN",
    "WRAP_CLOSE",
]

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
WRAP_OPEN, WRAP_CLOSE = "<tools>", "</tools>"
CALL_FENCES = ("", "json", "tool_call", "tool_code")  # info strings of a code block that may hold calls
_TAGGED = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_WRAPPED = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
_FENCED = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


def _call_objects(payload: Any) -> list[dict[str, Any]] | None:
    """The call objects in ``payload`` (an object or a list of them), or ``None`` if it is not that."""
    items = payload if isinstance(payload, list) and payload else [payload]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if not isinstance(arguments, (dict, str)):
            return None
        calls.append({"name": item["name"], "arguments": arguments})
    return calls


def _offered(calls: list[dict[str, Any]] | None, names: Collection[str] | None) -> bool:
    return calls is not None and (names is None or all(c["name"] in names for c in calls))


def _wire(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["arguments"]
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
        },
    }


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _spans(text: str, names: Collection[str] | None) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(start, end, calls) of every tagged, fenced and leading bare call in ``text``, in order."""
    spans: list[tuple[int, int, list[dict[str, Any]]]] = []
    for match in _TAGGED.finditer(text):
        calls = _call_objects(_loads(match.group(1)))
        if calls is not None:
            spans.append((match.start(), match.end(), calls))
    for match in _FENCED.finditer(text):
        if match.group(1).lower() in CALL_FENCES and not any(s <= match.start() < e for s, e, _ in spans):
            calls = _call_objects(_loads(match.group(2)))
            if _offered(calls, names):
                assert calls is not None
                spans.append((match.start(), match.end(), calls))
    for match in _WRAPPED.finditer(text):
        if not any(s <= match.start() < e for s, e, _ in spans):
            calls = _call_objects(_loads(match.group(1)))
            if _offered(calls, names):
                assert calls is not None
                spans.append((match.start(), match.end(), calls))
    spans.sort(key=lambda s: s[0])
    return _bare(text, names, spans[0][0] if spans else len(text)) + spans


def _bare(text: str, names: Collection[str] | None, limit: int) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """Call objects (or lists of them) the text opens with, one after another, before ``limit``."""
    out: list[tuple[int, int, list[dict[str, Any]]]] = []
    at = len(text) - len(text.lstrip())
    while at < limit and text[at : at + 1] in ("{", "["):
        try:
            payload, end = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        calls = _call_objects(payload)
        if not _offered(calls, names) or end > limit:
            break
        assert calls is not None
        out.append((at, end, calls))
        at = end + len(text[end:]) - len(text[end:].lstrip())
    return out


def parse_tool_calls(text: str, names: Collection[str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Split ``text`` into the content left and OpenAI-shaped tool calls (see the module docstring).

    ``names``: the offered tools (``None``: any name counts, for fenced and bare calls too).
    """
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    done = 0
    for start, end, objects in _spans(text, names):
        content.append(text[done:start])
        calls.extend(_wire(c) for c in objects)
        done = end
    content.append(text[done:])
    return "".join(content), calls


_NAMED = re.compile(r'\s*\[?\s*\{\s*"name"\s*:\s*"([^"\\]*)"')


def call_verdict(rest: str, names: Collection[str] | None = None) -> str:
    """``call``, ``open`` (may still become one) or ``text`` for what follows an opening.

    A call object opens with ``{"name"`` or ``[{"name"`` (blanks aside); with ``names``, one whose
    name is complete must name one of them.
    """
    compact = re.sub(r"\s+", "", rest[:64])
    if any(compact.startswith(p) for p in ('{"name"', '[{"name"')):
        named = _NAMED.match(rest)
        return "text" if names is not None and named is not None and named.group(1) not in names else "call"
    return "open" if any(p.startswith(compact) for p in ('{"name"', '[{"name"')) else "text"


def _opens_call(rest: str, names: Collection[str] | None = None) -> bool:
    return call_verdict(rest, names) != "text"


def unfinished_call_at(content: str, names: Collection[str] | None = None) -> int | None:
    """Where a call that never closed starts at the end of ``content`` (a length limit cut it), if one does.

    The content left after :func:`parse_tool_calls`; such a call is dropped from the answer, so its
    framing never reaches a client. ``names``: the offered tools (a fenced or bare object naming
    another tool is text).
    """
    tag = content.rfind(TAG_OPEN)
    if tag >= 0 and TAG_CLOSE not in content[tag:]:
        return tag
    wrap = content.rfind(WRAP_OPEN)
    if wrap >= 0 and WRAP_CLOSE not in content[wrap:] and _opens_call(content[wrap + len(WRAP_OPEN) :], names):
        return wrap
    fences = [m for m in re.finditer(r"```", content)]
    if len(fences) % 2 == 1:  # the last fence opens a block that never closed
        start = fences[-1].start()
        header, _, body = content[start + 3 :].partition("\n")
        if header.strip().lower() in CALL_FENCES and _opens_call(body, names):
            return start
    stripped = content.lstrip()
    if stripped[:1] in ("{", "[") and _opens_call(stripped, names) and _loads(stripped) is None:
        return len(content) - len(stripped)
    return None
