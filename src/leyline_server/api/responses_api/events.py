"""The Responses API's answer: the ``response`` object, and its event stream.

A stream is ``event: <type>`` + ``data: <json>`` frames, each with a ``sequence_number``:
``response.created`` → ``response.in_progress`` → per output item ``response.output_item.added``
(a message: ``response.content_part.added``, ``response.output_text.delta``…,
``response.output_text.done``, ``response.content_part.done``; a call:
``response.function_call_arguments.delta`` / ``.done``) → ``response.output_item.done`` → one of
``response.completed`` / ``response.incomplete`` (the full response, usage included) or
``response.failed``. Codex reads messages and calls from ``output_item.done`` and ends on
``completed``; openai-agents takes the final response from it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.responses_items import item_id

__all__ = ["ResponseShape", "Events", "response_usage"]


def response_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API's ``usage`` from the chat turn's (``cached_tokens``: reused + rotated)."""
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": usage["prompt_tokens"] - cached},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


@dataclass
class ResponseShape:
    """One response's identity and the request settings it echoes."""

    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: "resp_" + secrets.token_hex(16))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The ``response`` object."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            **self.echo,
            **extra,
        }


class Events:
    """SSE frames of one streamed response, numbered in order."""

    def __init__(self) -> None:
        self.sequence = 0

    def frame(self, kind: str, **data: Any) -> str:
        """One event."""
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def message_start(self, index: int, message_id: str) -> Iterator[str]:
        """A message item opens (before its first text)."""
        item = {"type": "message", "id": message_id, "status": "in_progress", "role": "assistant", "content": []}
        yield self.frame("response.output_item.added", output_index=index, item=item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self.frame("response.content_part.added", item_id=message_id, output_index=index, content_index=0,
                         part=part)  # fmt: skip

    def text_delta(self, index: int, message_id: str, delta: str, logprobs: list[Any]) -> str:
        """Text of the open message."""
        return self.frame("response.output_text.delta", item_id=message_id, output_index=index, content_index=0,
                          delta=delta, logprobs=logprobs)  # fmt: skip

    def message_end(self, index: int, item: Mapping[str, Any]) -> Iterator[str]:
        """The open message item closes, with its whole text."""
        part = item["content"][0]
        yield self.frame("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                         text=part["text"], logprobs=part.get("logprobs", []))  # fmt: skip
        yield self.frame("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                         part=part)  # fmt: skip
        yield self.frame("response.output_item.done", output_index=index, item=dict(item))

    def whole_item(self, index: int, item: Mapping[str, Any]) -> Iterator[str]:
        """An item that is complete when it appears (a function call, reasoning)."""
        opening = {**item, "status": "in_progress"}
        if item["type"] == "function_call":
            opening["arguments"] = ""
        yield self.frame("response.output_item.added", output_index=index, item=opening)
        if item["type"] == "function_call":
            yield self.frame("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                             delta=item["arguments"])  # fmt: skip
            yield self.frame("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                             arguments=item["arguments"], name=item["name"])  # fmt: skip
        yield self.frame("response.output_item.done", output_index=index, item=dict(item))


def new_message_id() -> str:
    """An id for a message item opened before its text is known."""
    return item_id("msg")
