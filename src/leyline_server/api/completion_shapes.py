"""OpenAI's chat completion shapes: completions, stream chunks, usage, logprobs, SSE framing."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from leyline_server.contract.values import GenerationStep, Turn

__all__ = ["Completion", "sse", "usage", "logprob_entry"]


def sse(payload: dict[str, Any] | str) -> str:
    """One Server-Sent Event ``data:`` frame."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def usage(turn: Turn) -> dict[str, Any]:
    """OpenAI's ``usage``; ``cached_tokens`` counts reused + rotated prompt tokens."""
    reused, rotated, _ = turn.counts()
    n = len(turn.generated)
    return {
        "prompt_tokens": len(turn.prompt),
        "completion_tokens": n,
        "total_tokens": len(turn.prompt) + n,
        "prompt_tokens_details": {"cached_tokens": reused + rotated},
    }


def _token_entry(tokenizer: Any, token: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token], skip_special_tokens=False)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def logprob_entry(tokenizer: Any, step: GenerationStep) -> dict[str, Any]:
    """One ``logprobs.content`` entry for a generated token."""
    entry = _token_entry(tokenizer, step.token, step.logprob if step.logprob is not None else 0.0)
    entry["top_logprobs"] = [_token_entry(tokenizer, t.token, t.logprob) for t in step.top_logprobs]
    return entry


@dataclass
class Completion:
    """Identity of one completion (id, creation time, model) and its response builders."""

    model: str
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def _frame(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    def body(
        self, message: dict[str, Any], finish_reason: str, logprobs: list[dict[str, Any]] | None, **extra: Any
    ) -> dict[str, Any]:
        """A whole ``chat.completion``."""
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
        }
        return self._frame("chat.completion", [choice], **extra)

    def chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """One ``chat.completion.chunk`` as an SSE frame."""
        choice = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish_reason,
            "logprobs": {"content": logprobs} if logprobs else None,
        }
        return sse(self._frame("chat.completion.chunk", [choice], **extra))

    def usage_chunk(self, turn: Turn) -> str:
        """The final usage-only chunk (``stream_options.include_usage``)."""
        return sse(self._frame("chat.completion.chunk", [], usage=usage(turn)))
