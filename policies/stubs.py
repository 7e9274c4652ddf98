"""Byte-stable stub and erratum texts: the same inputs always give the same text."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["call_signature", "tool_stub", "restub", "is_stub", "invalidated_read_erratum"]

MAX_ARGS_CHARS = 80
STUB_PREFIXES = ("[evicted:", "[stale:", "[outdated:")
VALUE_KEYS = ("content", "new_content", "text", "new_str", "patch", "diff", "data", "value")
_STUB = re.compile(r"\[(?:evicted|stale|outdated): (.*)\]", re.DOTALL)


def call_signature(tool: str, args: dict[str, Any]) -> str:
    """``read_file(path="a.py")``: arguments sorted, JSON values, cut at 80 characters."""
    parts = ", ".join(f"{k}={json.dumps(v, sort_keys=True, ensure_ascii=False)}" for k, v in sorted(args.items()))
    if len(parts) > MAX_ARGS_CHARS:
        parts = parts[: MAX_ARGS_CHARS - 1] + "…"
    return f"{tool}({parts})"


def tool_stub(tool: str, args: dict[str, Any], removed_chars: int, why: str = "evicted", note: str = "") -> str:
    """``[evicted: read_file(path="a.py") output, 1,234 chars]`` — depends only on its inputs."""
    tail = f"; {note}" if note else ""
    return f"[{why}: {call_signature(tool, args)} output, {removed_chars:,} chars{tail}]"


def restub(stub: str, why: str, note: str = "") -> str | None:
    """An existing stub under a new label (``[evicted: …]`` → ``[outdated: …; note]``); ``None`` if not a stub."""
    match = _STUB.fullmatch(stub)
    if match is None:
        return None
    tail = f"; {note}" if note else ""
    return f"[{why}: {match.group(1)}{tail}]"


def is_stub(text: str) -> bool:
    """Whether ``text`` is already a stub written by a policy (never stubbed twice)."""
    return text.startswith(STUB_PREFIXES)


def _new_value(args: dict[str, Any]) -> tuple[str, str] | None:
    """The (argument name, text) of a write's new content, if it names one."""
    for key in VALUE_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return key, value
    return None


def invalidated_read_erratum(
    read: tuple[str, dict[str, Any]],
    write: tuple[str, dict[str, Any]],
    write_output: str,
    reread: tuple[str, dict[str, Any]] | None = None,
    max_value_chars: int = 1000,
) -> str:
    """The text of an erratum for a read whose resource a later write changed.

    It names the read (tool and arguments), says its output is outdated, names the write, and
    gives the new value or where to find it: the later re-read if there is one, else the
    write's content argument (quoted up to ``max_value_chars``), else the write's output::

        The earlier output of read_file(path="app.py") is outdated: write_file(path="app.py")
        changed it afterwards. New content:
        def add(a, b): ...
    """
    (read_tool, read_args), (write_tool, write_args) = read, write
    value = _new_value(write_args)
    shown = {k: v for k, v in write_args.items() if value is None or k != value[0]}
    text = (
        f"The earlier output of {call_signature(read_tool, read_args)} is outdated: "
        f"{call_signature(write_tool, shown)} changed it afterwards."
    )
    if reread is not None:
        return text + f" The later {call_signature(*reread)} output shows the current value."
    if value is not None:
        key, new = value
        if len(new) <= max_value_chars:
            return text + f" New {key}:\n{new}"
        return text + f" The new {key} ({len(new):,} chars) is in the arguments of that {write_tool} call."
    if write_output and not is_stub(write_output) and len(write_output) <= max_value_chars:
        return text + f" {write_tool} returned:\n{write_output}"
    return text + f" See that {write_tool} call and its output."
