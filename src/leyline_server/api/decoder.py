"""Generated tokens to the assistant's answer: one decoder for streamed and whole responses.

:meth:`TextDecoder.outcome` is the answer, computed from all the tokens the same way whatever the
transport: the text (special tokens dropped unless kept, stop tokens trimmed, cut at the first stop
string), the tool calls parsed out of it (only when the request had tools), the content left, and
the finish reason. A stream shows text as it comes (:meth:`push`: whole characters only, never
part of a stop string, nothing from the first ``<tool_call>`` on) and ends with :meth:`rest`, the
part of that same content not shown yet, so the deltas add up to the whole response's content for
the same tokens, however generation ended (a ``max_tokens`` cut inside a call included: the
unfinished call is content in both).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from leyline_server.api.toolcalls import parse_tool_calls

__all__ = ["TextDecoder", "Outcome", "TOOL_MARK"]

TOOL_CLOSE = "</tool_call>"
TOOL_MARK = "<tool_call>"


@dataclass
class Outcome:
    """The answer: the assistant message, its tool calls and the finish reason."""

    message: dict[str, Any]
    calls: list[dict[str, Any]]
    finish_reason: str
    content: str  # the content text ("" when the message's content is null)


class TextDecoder:
    """Turns generated tokens into the answer (see the module docstring).

    ``stop_ids``: tokens that end generation (trimmed unless ``keep_stop``); ``stops``: stop
    strings (cut before them, or after them with ``keep_stop``: SGLang's ``no_stop_trim``);
    ``parse_tools``: take ``<tool_call>`` blocks out as calls (special tokens are then kept, as
    SGLang does, since call markers may be special tokens); ``parallel``: keep more than one call.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop_ids: Iterable[int],
        stops: list[str],
        parse_tools: bool = False,
        parallel: bool = True,
        skip_special: bool = False,
        keep_stop: bool = False,
    ) -> None:
        self.tokenizer, self.stop_ids, self.stops = tokenizer, set(stop_ids), stops
        self.parse_tools, self.parallel = parse_tools, parallel
        self.skip_special = skip_special and not parse_tools
        self.keep_stop = keep_stop
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, if one did

    def text(self) -> str:
        """Everything generated so far, cut at the first stop string."""
        ids = self.ids if self.keep_stop else [t for t in self.ids if t not in self.stop_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)
        cut = len(text)
        for stop in self.stops:
            at = text.find(stop)
            if 0 <= at and at + (len(stop) if self.keep_stop else 0) <= cut:
                self.stopped = True
                cut = at + (len(stop) if self.keep_stop else 0)
                self.matched = stop
        return text[:cut]

    def _visible(self, text: str) -> str:
        return text.split(TOOL_MARK, 1)[0] if self.parse_tools else text

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to show."""
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):
            return ""
        visible = self._visible(text)
        hold = 0 if self.keep_stop else max((len(s) - 1 for s in self.stops), default=0)
        if self.parse_tools:
            hold = max(hold, len(TOOL_MARK) - 1)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta

    def outcome(self, reason: str | None) -> Outcome:
        """The answer for every token pushed; ``reason`` is the engine's finish reason."""
        text = self.text()
        content, calls = parse_tool_calls(text) if self.parse_tools else (text, [])
        if self.parse_tools:  # a call cut short (a length limit) is no content: its framing never leaks
            content = _without_unfinished_call(content)
        if not self.parallel:
            calls = calls[:1]
        if calls and not content.strip():
            content = ""
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else ("stop" if self.stopped else (reason or "stop"))
        return Outcome(message, calls, finish, content)

    def rest(self, outcome: Outcome) -> str:
        """The part of ``outcome``'s content a stream has not shown yet."""
        content = outcome.content
        delta = content[self.emitted :] if content.startswith(self.text()[: self.emitted]) else ""
        self.emitted = max(self.emitted, len(content))
        return delta


def _without_unfinished_call(content: str) -> str:
    """``content`` without a trailing ``<tool_call>`` that never closed."""
    at = content.rfind(TOOL_MARK)
    if at < 0 or TOOL_CLOSE in content[at:]:
        return content
    return content[:at]
