"""Generated tokens to the assistant's answer: one decoder for streamed and whole responses.

:meth:`TextDecoder.outcome` is the answer, computed from all the tokens the same way whatever the
transport: the text (special tokens dropped unless kept, stop tokens trimmed, cut at the first stop
string), the tool calls parsed out of it (only when the request had tools), the content left, and
the finish reason. A stream shows text as it comes (:meth:`push`: whole characters only, never
part of a stop string, nothing from where a tool call may begin: :mod:`.callscan`) and ends with
:meth:`rest`, the
part of that same content not shown yet, so the deltas add up to the whole response's content for
the same tokens, however generation ended (a ``max_tokens`` cut inside a call included: the
unfinished call is content in both).

:meth:`~TextDecoder.push` costs time in proportion to the new text, not to the answer so far: it
decodes a short window (the tokens since the last whole character, behind the chunk committed
before them, so that a tokenizer that drops a first token's leading space treats the window as it
treats the whole answer) and looks for stop strings only in the new text and the few characters
before it that a match could start in (the call scan, likewise, re-reads only from its last
undecided opening). Its text is ``tokenizer.decode`` of all
the tokens; where that cannot be relied on, push decodes all the tokens each time, as it always
did: a tokenizer that cleans up spaces across tokens, stop strings that are empty or hold U+FFFD,
every push after a stop, and every later decoder of a tokenizer whose streamed text once differed
from the whole decode (checked in :meth:`~TextDecoder.outcome`); and a push whose window rewrote the
chunk before it (byte fallback does, while a character's bytes are coming), or whose new text holds bytes
that make no character (U+FFFD before its end), decodes everything once.
:meth:`~TextDecoder.outcome` and :meth:`~TextDecoder.rest` decode all the tokens once each.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from leyline_server.api.callscan import CallScan, hold_of
from leyline_server.api.toolcalls import parse_tool_calls, unfinished_call_at

__all__ = ["TextDecoder", "Outcome"]

log = logging.getLogger("leyline.api")

PARTIAL = "\ufffd"  # a decode ends with it while a character's bytes are still to come

# Tokenizers whose streamed text once differed from the whole decode: decoders decode everything for them.
_DISTRUSTED: weakref.WeakSet[Any] = weakref.WeakSet()


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
    ``parse_tools``: take tool calls out of the text (:mod:`.toolcalls`; where the call markers are
    special tokens, special tokens are then kept, as vLLM and SGLang do; otherwise ``skip_special``
    holds, so that a stray ``<|im_start|>`` never reaches the content); ``tool_names``: the offered
    tools (a fenced or bare call must name one); ``parallel``: keep more than one call.
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
        tool_names: Iterable[str] | None = None,
    ) -> None:
        self.tokenizer, self.stop_ids, self.stops = tokenizer, set(stop_ids), stops
        self.parse_tools, self.parallel = parse_tools, parallel
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.skip_special = skip_special and not (parse_tools and _special_marks(tokenizer))
        self.keep_stop = keep_stop
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, if one did
        self._hold = 0 if keep_stop else max((len(s) - 1 for s in stops), default=0)
        # How far back a match may start: the committed text's last ``_reach`` characters are kept.
        self._reach = max((len(s) for s in stops), default=0)
        self._scan = CallScan() if parse_tools else None  # where a tool call may begin
        self._whole = not _streams_exactly(tokenizer, stops)  # decode all the tokens on every push
        self._window: list[int] = []  # the tokens decoded together: the committed chunk, then the pending ones
        self._read = 0  # how many of them are the committed chunk
        self._prefix = ""  # that chunk's text, decoded on its own
        self._chunks: list[str] = []  # the committed text: a prefix of the whole decode, ending in a whole character
        self._done = 0  # its length
        self._recent = ""  # its last ``_reach`` characters
        self._tail: str | None = ""  # the pending tokens' text as of the last push (None: not known)
        self._unshown = ""  # the committed text from ``emitted`` on
        self._pushed = 0  # ``len(ids)`` after the last push done in the window
        self._shown = 0  # ``emitted`` as that push left it

    def text(self) -> str:
        """Everything generated so far, cut at the first stop string."""
        return self._cut_whole(self._decode_all())

    def _decode_all(self) -> str:
        ids = self.ids if self.keep_stop else [t for t in self.ids if t not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _cut_whole(self, text: str) -> str:
        cut = len(text)
        for stop in self.stops:
            at = text.find(stop)
            if 0 <= at and at + (len(stop) if self.keep_stop else 0) <= cut:
                self.stopped = True
                cut = at + (len(stop) if self.keep_stop else 0)
                self.matched = stop
        return text[:cut]

    def _visible(self, text: str) -> str:
        return text[: hold_of(text)] if self.parse_tools else text

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to show."""
        self.ids.append(token)
        if self._whole or self.stopped or self.emitted != self._shown or len(self.ids) != self._pushed + 1:
            self._whole = True  # from here on, the whole decode every time
            return self._push_whole()
        self._pushed = len(self.ids)
        if token in self.stop_ids and not self.keep_stop:
            return ""  # trimmed: the text, and so what is safe to show, is what it was
        self._window.append(token)
        new = self.tokenizer.decode(self._window, skip_special_tokens=self.skip_special)
        if not new.startswith(self._prefix):  # the new token rewrote the committed chunk's text
            return self._push_rewritten()
        tail, before = new[len(self._prefix) :], self._done
        if PARTIAL in tail.rstrip(PARTIAL):  # bytes that make no character: their text depends on context
            return self._push_rewritten()
        self._tail = tail
        region, base = self._recent + tail, before - len(self._recent)  # the text from ``base`` on
        cut = self._cut_new(region, base, before)
        committed = bool(tail) and not tail.endswith(PARTIAL)
        if committed:
            self._commit(tail)
        if cut > base and region[cut - 1 - base] == PARTIAL:
            return ""
        return self._delta(region, base, before, cut, "" if committed else tail)

    def _push_whole(self) -> str:
        text = self.text()
        if text.endswith(PARTIAL):
            return ""
        visible = self._visible(text)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - self._hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta

    def _push_rewritten(self) -> str:
        """A push whose window rewrote the chunk before it: the whole decode's answer.

        Byte fallback does that (bytes that were a whole character become U+FFFD with a byte that
        does not continue them) until the character after them is whole. If this push shows nothing
        and stops nothing, the window goes on; otherwise every later push decodes everything.
        """
        before = (self.emitted, self.stopped)
        delta = self._push_whole()
        if delta or (self.emitted, self.stopped) != before:
            self._whole = True
        self._tail = None  # not known from the window
        return delta

    def _cut_new(self, region: str, base: int, before: int) -> int:
        """Where the text ends (a stop string's cut, as :meth:`text` makes it); sets ``stopped``, ``matched``.

        No stop string was in the text before this push, and its first ``before`` characters are
        unchanged, so each match ends after ``before``: it starts in ``region`` (the text from
        ``base``), at most ``len(stop) - 1`` characters before ``before``.
        """
        cut = base + len(region)
        for stop in self.stops:
            at = region.find(stop, max(before - len(stop) + 1, 0) - base)
            if 0 <= at and base + at + (len(stop) if self.keep_stop else 0) <= cut:
                self.stopped = True
                cut = base + at + (len(stop) if self.keep_stop else 0)
                self.matched = stop
        return cut

    def _commit(self, tail: str) -> None:
        """Add the pending tokens' text (``tail``, ending in a whole character) to the committed text."""
        self._window = self._window[self._read :]  # the new chunk becomes the next window's context
        self._read = len(self._window)
        self._prefix = self.tokenizer.decode(self._window, skip_special_tokens=self.skip_special)
        self._chunks.append(tail)
        if self._scan is not None:
            self._scan.feed(tail)
        self._unshown += tail
        self._done += len(tail)
        self._recent = (self._recent + tail)[-self._reach :] if self._reach else ""
        self._tail = ""

    def _delta(self, region: str, base: int, before: int, cut: int, pending: str) -> str:
        """:meth:`push`'s answer once the text up to ``cut`` ends in a whole character."""
        end = cut
        if self._scan is not None:  # a stop string cut the text: the hold of the text as cut
            hold = hold_of((self._scan.text + pending)[:cut]) if self.stopped else self._scan.hold(pending)
            if hold is not None and hold < end:
                end = hold
        safe_end = end if self.stopped or end < cut else max(end - self._hold, 0)
        delta = ""
        if safe_end > self.emitted:
            shown = safe_end - self.emitted
            delta = (self._unshown + pending)[:shown]
            self._unshown = self._unshown[shown:]
            self.emitted = safe_end
        self._shown = self.emitted
        return delta

    def outcome(self, reason: str | None) -> Outcome:
        """The answer for every token pushed; ``reason`` is the engine's finish reason."""
        decoded = self._decode_all()
        self._check(decoded)
        text = self._cut_whole(decoded)
        log.debug("answer of %d tokens (%s): %r", len(self.ids), reason, text)
        content, calls = parse_tool_calls(text, self.tool_names) if self.parse_tools else (text, [])
        if self.parse_tools:  # a call cut short (a length limit) is no content: its framing never leaks
            cut_at = unfinished_call_at(content, self.tool_names)
            content = content if cut_at is None else content[:cut_at]
        if not self.parallel:
            calls = calls[:1]
        if calls and not content.strip():
            content = ""
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else ("stop" if self.stopped else (reason or "stop"))
        return Outcome(message, calls, finish, content)

    def _check(self, decoded: str) -> None:
        """Distrust the tokenizer if the text the window pushes saw is not the whole decode."""
        if self._whole or self._tail is None or not self.ids or len(self.ids) != self._pushed:
            return
        if self._tail.endswith(PARTIAL):  # a character cut short: byte fallback may space it otherwise
            return
        if "".join(self._chunks) + self._tail != decoded:
            log.warning("streamed text differed from the whole decode; decoding every token from now on")
            self._whole = True
            _DISTRUSTED.add(self.tokenizer)

    def rest(self, outcome: Outcome) -> str:
        """The part of ``outcome``'s content a stream has not shown yet."""
        content = outcome.content
        delta = content[self.emitted :] if content.startswith(self.text()[: self.emitted]) else ""
        self.emitted = max(self.emitted, len(content))
        return delta


def _streams_exactly(tokenizer: Any, stops: list[str]) -> bool:
    """Whether :meth:`TextDecoder.push` may decode a window (see the module docstring)."""
    if any(not stop or PARTIAL in stop for stop in stops):
        return False
    if _cleans_up(tokenizer):
        return False  # " ." becomes "." across tokens: the window's text is not the whole text's
    try:
        return tokenizer not in _DISTRUSTED
    except TypeError:  # not weakly referable (an unusual tokenizer): trust it, outcome still checks
        return True


def _cleans_up(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` cleans up spaces (transformers 5.24 skips that for BPE models)."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    model = type(getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)).__name__
    forced = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    return model != "BPE" or bool(forced)


_SPECIAL_MARKS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _special_marks(tokenizer: Any) -> bool:
    """Whether ``<tool_call>`` is one special token of ``tokenizer`` (then decoding must keep specials)."""
    try:
        return _SPECIAL_MARKS[tokenizer]
    except (KeyError, TypeError):
        pass
    try:
        ids = tokenizer.encode("<tool_call>", add_special_tokens=False)
        special = len(ids) == 1 and ids[0] in set(getattr(tokenizer, "all_special_ids", ()) or ())
    except Exception:  # noqa: BLE001 - a tokenizer without encode: keep specials, as before
        return True
    try:
        _SPECIAL_MARKS[tokenizer] = special
    except TypeError:  # not weakly referable
        pass
    return special
