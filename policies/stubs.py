"""Byte-stable stub texts: the same evicted message always renders the same way."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tool_stub", "is_stub"]

MAX_ARGS_CHARS = 80


def tool_stub(tool: str, args: dict[str, Any], removed_chars: int, why: str = "evicted") -> str:
    """``[evicted: read_file(path="a.py") output, 1,234 chars]`` — depends only on its inputs."""
    parts = ", ".join(f"{k}={json.dumps(v, sort_keys=True, ensure_ascii=False)}" for k, v in sorted(args.items()))
    if len(parts) > MAX_ARGS_CHARS:
        parts = parts[: MAX_ARGS_CHARS - 1] + "…"
    return f"[{why}: {tool}({parts}) output, {removed_chars:,} chars]"


def is_stub(text: str) -> bool:
    """Whether ``text`` is already a stub written by a policy (never stubbed twice)."""
    return text.startswith(("[evicted:", "[stale:"))
