"""Incremental detokenization for streaming: whole characters only, stop strings and tool calls held back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["TextDecoder", "TOOL_MARK"]

TOOL_MARK = "<tool_call>"


class TextDecoder:
    """Turns generated tokens into text deltas that never show half a UTF-8 character, any part
    of a stop string, or a tool call (tool calls are sent parsed, at the end)."""

    def __init__(self, tokenizer: Any, eos_ids: Iterable[int], stops: list[str], hide_tools: bool = True) -> None:
        self.tokenizer, self.eos_ids, self.stops = tokenizer, set(eos_ids), stops
        self.hide_tools = hide_tools
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False

    def text(self) -> str:
        """Everything generated so far, cut at the first stop string."""
        ids = [t for t in self.ids if t not in self.eos_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0:
                self.stopped = True
                text = text[:at]
        return text

    def _visible(self, text: str) -> str:
        return text.split(TOOL_MARK, 1)[0] if self.hide_tools else text

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to show."""
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):
            return ""
        visible = self._visible(text)
        hold = max((len(s) - 1 for s in self.stops), default=0)
        if self.hide_tools:
            hold = max(hold, len(TOOL_MARK) - 1)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta

    def rest(self) -> str:
        """Whatever was held back, at the end of generation."""
        visible = self._visible(self.text())
        delta = visible[self.emitted :]
        self.emitted = len(visible)
        return delta
