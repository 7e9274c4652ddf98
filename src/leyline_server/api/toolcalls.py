"""Parse tool calls out of generated text (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``)."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

__all__ = ["parse_tool_calls"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split ``text`` into plain content and OpenAI-shaped tool calls.

    Only well-formed calls (JSON with a string ``name``) are taken; anything else stays in the
    content untouched.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", {})
        calls.append(
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    content = _CALL.sub(take, text)
    return content, calls
