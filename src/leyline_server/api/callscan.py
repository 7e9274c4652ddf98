"""Where a stream must stop showing text: the first place a tool call may begin.

A streamed answer shows its text as it comes, but never a call's framing (:mod:`.toolcalls` says
which forms are calls). :class:`CallScan` reads the answer's text as it grows and keeps the
*hold*: the start of the first opening that is a call or may still become one. Everything before
the hold is safe to show; from the hold on, the stream waits, and the end of the answer decides
(the call leaves the content, anything else is sent then).

* ``<tool_call>`` — always held;
* ``<tools>`` — held while what follows may open a call object (``{"name"``), shown otherwise;
* a code fence (three backticks) — held until its info string and the first characters of its
  body are known: an info string outside ``json``/``tool_call``/``tool_code``/none, or a body that
  does not open with ``{"name"`` (or ``[{"name"``), makes it an ordinary code block, shown as it
  comes, and the scan resumes after its closing fence;
* the answer's first non-blank character, when it is ``{`` or ``[`` — held while it may open a
  bare call object;
* the last characters of the text, when they may be the start of ``<tool_call>``, ``<tools>`` or
  of a fence.

The scan keeps what it decided (a code block is code; a call is a call, for good) and re-reads
only from its last undecided opening, so a push costs time in proportion to the new text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from leyline_server.api.toolcalls import CALL_FENCES, TAG_OPEN, WRAP_OPEN, call_verdict

__all__ = ["CallScan", "hold_of"]

FENCE = "```"
_NONBLANK = re.compile(r"\S")


@dataclass(frozen=True)
class _State:
    pos: int = 0  # everything before it is decided: shown (or, when ``final``, the call's start)
    in_block: bool = False  # ``pos`` lies inside an ordinary code block (its closing fence not seen)
    bare_ok: bool = True  # the answer's first non-blank character is not behind ``pos`` yet
    final: bool = False  # ``pos`` starts a call: held for good


def _partial_at(text: str, start: int) -> int | None:
    """Where the text's end may begin ``<tool_call>``, ``<tools>`` or a fence (at or after ``start``), if it does."""
    for marker in (TAG_OPEN, WRAP_OPEN, FENCE):
        for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
            if text.endswith(marker[:k]):
                return len(text) - k
    return None


def _fence_verdict(text: str, at: int) -> str:
    """``call``, ``code`` or ``open`` (not known yet) for the fence at ``at``."""
    line_end = text.find("\n", at + len(FENCE))
    header = text[at + len(FENCE) : line_end if line_end >= 0 else len(text)].strip().lower()
    if line_end < 0:
        return "open" if any(h.startswith(header) for h in CALL_FENCES) else "code"
    if header not in CALL_FENCES:
        return "code"
    first = _NONBLANK.search(text, line_end + 1)
    if first is None:
        return "open"
    verdict = call_verdict(text[first.start() : first.start() + 64])
    return "code" if verdict == "text" else verdict


def _scan(text: str, state: _State) -> tuple[int | None, _State]:
    """The hold (``None``: nothing to hold) and the state to resume from next time."""
    if state.final:
        return state.pos, state
    pos, in_block, bare_ok = state.pos, state.in_block, state.bare_ok
    while True:
        if in_block:
            close = text.find(FENCE, pos)
            if close < 0:
                return None, _State(max(pos, len(text) - len(FENCE) + 1), True, False)
            pos, in_block = close + len(FENCE), False
            continue
        if bare_ok:
            first = _NONBLANK.search(text, pos)
            if first is None:
                return None, _State(pos, False, True)
            at = first.start()
            verdict = call_verdict(text[at : at + 64]) if text[at] in "{[" else "text"
            if verdict != "text":
                return at, _State(at if verdict == "call" else pos, False, verdict == "open", verdict == "call")
            bare_ok = False
        tag, fence, wrap = text.find(TAG_OPEN, pos), text.find(FENCE, pos), text.find(WRAP_OPEN, pos)
        if tag >= 0 and all(other < 0 or tag < other for other in (fence, wrap)):
            return tag, _State(tag, False, False, True)
        if wrap >= 0 and (fence < 0 or wrap < fence):
            body = text[wrap + len(WRAP_OPEN) :]
            first = _NONBLANK.search(body)
            verdict = call_verdict(body[first.start() : first.start() + 64]) if first else "open"
            if verdict != "text":
                return wrap, _State(wrap, False, False, verdict == "call")
            pos = wrap + len(WRAP_OPEN)
            continue
        if fence >= 0:
            verdict = _fence_verdict(text, fence)
            if verdict != "code":
                return fence, _State(fence, False, False, verdict == "call")
            line_end = text.find("\n", fence)
            if line_end < 0:  # an ordinary block whose first line is still coming: shown, decided later
                return None, _State(fence, False, False)
            pos, in_block = line_end + 1, True
            continue
        partial = _partial_at(text, pos)
        return partial, _State(max(pos, len(text) - len(TAG_OPEN) + 1) if partial is None else partial, False, False)


def hold_of(text: str) -> int:
    """Where ``text`` must stop being shown (its length when nothing is held)."""
    hold, _ = _scan(text, _State())
    return len(text) if hold is None else hold


class CallScan:
    """The hold of a growing text (see the module docstring): :meth:`feed` what is final, :meth:`hold` to ask."""

    def __init__(self) -> None:
        self.text = ""
        self._state = _State()

    def feed(self, more: str) -> None:
        """Append text that will not change again (committed text)."""
        self.text += more
        _, self._state = _scan(self.text, self._state)

    def hold(self, pending: str = "") -> int | None:
        """The hold over the fed text plus ``pending`` (text that may still change), or ``None``."""
        hold, _ = _scan(self.text + pending if pending else self.text, self._state)
        return hold
