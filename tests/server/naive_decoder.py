"""The oracle of ``test_decoder.py``: the decoder as it was before its push went incremental.

:class:`NaiveDecoder` re-decodes and re-scans the whole answer on every token (a verbatim copy of
the old decoder); :func:`naive_hold` walks the whole text from its start each time. Slow and
plainly right: the incremental :class:`~leyline_server.api.decoder.TextDecoder` must agree with
it at every step.
"""

from __future__ import annotations

from typing import Any

from leyline_server.api.decoder import Outcome
from leyline_server.api.toolcalls import parse_tool_calls, unfinished_call_at

CALL_HEADERS = ("", "json", "tool_call", "tool_code")


def may_open_call(rest: str) -> bool:
    """Whether ``rest`` begins ``{"name"`` or ``[{"name"`` (blanks aside), or may still."""
    compact = "".join(rest[:64].split())
    return any(compact.startswith(p) or p.startswith(compact) for p in ('{"name"', '[{"name"'))


def naive_hold(text: str) -> int:
    """Where a stream stops showing text, found by walking the whole text from its start every time."""
    lead = len(text) - len(text.lstrip())
    if lead < len(text) and text[lead] in "{[" and may_open_call(text[lead:]):
        return lead
    i = scanned = 0
    while i < len(text):
        if text.startswith("<tool_call>", i):
            return i
        if text.startswith("<tools>", i):
            body = text[i + len("<tools>") :].lstrip()
            if not body or may_open_call(body):
                return i
        if text.startswith("```", i):
            line_end = text.find("\n", i)
            header = text[i + 3 : len(text) if line_end < 0 else line_end].strip().lower()
            if line_end < 0:
                if any(h.startswith(header) for h in CALL_HEADERS):
                    return i
                return len(text)  # an ordinary block whose first line is still coming
            body = text[line_end + 1 :]
            if header in CALL_HEADERS and (not body.strip() or may_open_call(body.lstrip())):
                return i
            close = text.find("```", line_end + 1)  # an ordinary code block: shown to its closing fence
            if close < 0:
                return len(text)
            i = scanned = close + 3
            continue
        i += 1
    for k in range(min(len("<tool_call>") - 1, len(text)), 0, -1):  # the start of a marker, at the end
        tags = text.endswith("<tool_call>"[:k]) or text.endswith("<tools>"[:k])
        marker = tags or (k < 3 and text.endswith("```"[:k]))
        if len(text) - k >= scanned and marker:
            return len(text) - k
    return len(text)


class NaiveDecoder:
    """The decoder as it was before push went incremental (a verbatim copy): the oracle."""

    def __init__(
        self, tokenizer, stop_ids, stops, parse_tools=False, parallel=True, skip_special=False, keep_stop=False,
        tool_names=None,
    ):  # fmt: skip
        self.tokenizer, self.stop_ids, self.stops = tokenizer, set(stop_ids), stops
        self.parse_tools, self.parallel = parse_tools, parallel
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        marks = tokenizer.encode("<tool_call>", add_special_tokens=False) if hasattr(tokenizer, "encode") else [0]
        specials = getattr(tokenizer, "all_special_ids", [0])
        special_marks = len(marks) == 1 and marks[0] in specials  # then every special is kept
        self.skip_special = skip_special and not (parse_tools and special_marks)
        self.keep_stop = keep_stop
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None

    def text(self) -> str:
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
        return text[: naive_hold(text)] if self.parse_tools else text

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):
            return ""
        visible = self._visible(text)
        hold = 0 if self.keep_stop else max((len(s) - 1 for s in self.stops), default=0)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta

    def outcome(self, reason: str | None) -> Outcome:
        text = self.text()
        content, calls = parse_tool_calls(text, self.tool_names) if self.parse_tools else (text, [])
        if self.parse_tools:
            at = unfinished_call_at(content, self.tool_names)
            content = content if at is None else content[:at]
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
        content = outcome.content
        delta = content[self.emitted :] if content.startswith(self.text()[: self.emitted]) else ""
        self.emitted = max(self.emitted, len(content))
        return delta
