"""The Messages API's answer: the message object, its usage, and its server-sent events.

Events in the order Anthropic's clients parse them (the SSE event name is the data's ``type``):
``message_start`` (empty content), ``ping``, then per block ``content_block_start`` →
``content_block_delta`` (``text_delta``, ``input_json_delta``, ``thinking_delta`` then
``signature_delta``) → ``content_block_stop``, then ``message_delta`` (``stop_reason``,
``stop_sequence``, the usage, ``context_management``) and ``message_stop``. Claude Code shows
nothing of a block without its ``content_block_stop``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["new_message_id", "message_usage", "message_body", "frame", "BlockStream"]


def new_message_id() -> str:
    """A fresh message id (``msg_…``)."""
    return "msg_" + secrets.token_hex(12)


def message_usage(usage: Mapping[str, Any], cache_marked: bool) -> dict[str, Any]:
    """Anthropic's usage from the chat turn's: ``cache_read_input_tokens`` the prompt tokens not
    computed (reused or rotated); the computed ones are ``cache_creation_input_tokens`` when the
    request marked a ``cache_control`` breakpoint (they are cached), ``input_tokens`` otherwise.
    The three add up to the prompt, as Anthropic's do."""
    prompt = int(usage.get("prompt_tokens", 0))
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    computed = prompt - cached
    return {
        "input_tokens": 0 if cache_marked else computed,
        "cache_creation_input_tokens": computed if cache_marked else 0,
        "cache_read_input_tokens": cached,
        "output_tokens": int(usage.get("completion_tokens", 0)),
    }


def message_body(message_id: str, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                 usage: dict[str, Any], **extra: Any) -> dict[str, Any]:  # fmt: skip
    """The message object (``stop``: ``(stop_reason, stop_sequence)``; ``extra``: added fields)."""
    body = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}  # fmt: skip
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def frame(event: dict[str, Any]) -> str:
    """One server-sent event (its name is its ``type``)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class BlockStream:
    """The block events of one message, numbered in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open = False

    def start(self, block: dict[str, Any]) -> str:
        """``content_block_start`` of the next block."""
        self.index += 1
        self.open = True
        return frame({"type": "content_block_start", "index": self.index, "content_block": block})

    def delta(self, delta: dict[str, Any]) -> str:
        """``content_block_delta`` of the open block."""
        return frame({"type": "content_block_delta", "index": self.index, "delta": delta})

    def stop(self) -> str:
        """``content_block_stop`` of the open block."""
        self.open = False
        return frame({"type": "content_block_stop", "index": self.index})

    def whole(self, block: Mapping[str, Any]) -> Iterator[str]:
        """A block known whole (thinking, a tool call, the text): start, its deltas, stop."""
        kind = block["type"]
        if kind == "thinking":
            yield self.start({"type": "thinking", "thinking": "", "signature": ""})
            yield self.delta({"type": "thinking_delta", "thinking": block["thinking"]})
            yield self.delta({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            yield self.start({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
            yield self.delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        else:
            yield self.start({"type": "text", "text": ""})
            if block.get("text"):
                yield self.delta({"type": "text_delta", "text": block["text"]})
        yield self.stop()
