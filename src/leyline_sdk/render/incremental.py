"""Incremental chat rendering: a conversation's next turn costs what changed, not the history.

:class:`IncrementalRenderer` wraps an :class:`~leyline_sdk.render.rendering.HFChatTokenizer` and keeps
the last *stable* rendering of its conversation (a :class:`Snapshot`: the template's text without
the generation prompt, the tokens, and each message's character and token bounds). Rendering the
next turn then:

1. renders the template once over the whole conversation (linear, unavoidable);
2. lays the messages out on that text: a message equal to the one at the same index in the
   snapshot must appear there byte for byte (its cached piece); every other message (new, or
   edited by a policy) is located by one template render of its prefix, which must be a prefix
   of the full text;
3. tokenizes only windows around the changed messages: each window starts one unchanged
   message before the run of changed ones and ends one unchanged message after it (or at the
   end); both ends must be *hard splits* (the text's ends, or next to an added special token
   such as ``<|im_start|>``, which tokenizers cut out before anything else, so tokenization
   never crosses them), and the context messages must come out as exactly their cached tokens,
   with token boundaries where the messages meet — the window is aligned with the
   tokenization of the whole text;
4. reuses the cached tokens of every unchanged message.

Any doubt — no snapshot, other tools, the head or an unchanged message's text moved or changed,
a prefix render that is not a prefix, a window edge that is not a hard split, a token straddling
a boundary, a context message that tokenizes differently — falls back to the full render (which
then reports instability as usual). The result is always what :meth:`HFChatTokenizer.render`
returns for the same input. Templates whose messages are not delimited by special tokens
(plain-text role markers) therefore always take the full, quadratic path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leyline_sdk.core.errors import RenderError
from leyline_sdk.render.rendering import (
    HFChatTokenizer,
    RenderDetail,
    RenderedConversation,
    Span,
    _char_to_token_boundaries,
    normalize_messages,
)

__all__ = ["IncrementalRenderer", "Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """A stable rendering without the generation prompt; cells are the head and each message.

    Cell ``c`` spans ``text[char_bounds[c]:char_bounds[c + 1]]`` and
    ``tokens[token_bounds[c]:token_bounds[c + 1]]``; cell 0 is the head, cell ``i + 1`` message ``i``.
    """

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    preamble: str
    text: str
    char_bounds: list[int]
    tokens: list[int]
    token_bounds: list[int]

    @classmethod
    def of(cls, detail: RenderDetail, messages: list[dict[str, Any]], tools: list[Any] | None) -> Snapshot:
        """The reusable part of a full rendering (everything but the generation prompt)."""
        end_char, end_token = detail.char_bounds[-1], detail.token_bounds[-1]
        return cls(
            messages=messages,
            tools=tools,
            preamble=detail.preamble,
            text=detail.text[:end_char],
            char_bounds=list(detail.char_bounds),
            tokens=detail.conversation.tokens[:end_token],
            token_bounds=list(detail.token_bounds),
        )

    def cell_tokens(self, cell: int) -> list[int]:
        """The cached tokens of cell ``cell``."""
        return self.tokens[self.token_bounds[cell] : self.token_bounds[cell + 1]]


class _Doubt(Exception):
    """Internal: the incremental path cannot prove its result; render in full."""


class IncrementalRenderer:
    """A :class:`~leyline_sdk.render.rendering.ChatTokenizer` that remembers its last conversation.

    One instance per conversation (a session): rendering an unrelated conversation is correct
    but gains nothing. ``full_renders`` and ``incremental_renders`` count which path was taken.
    """

    def __init__(self, chat: HFChatTokenizer) -> None:
        self.chat = chat
        self.snapshot: Snapshot | None = None
        self.full_renders = 0
        self.incremental_renders = 0

    def reset(self) -> None:
        """Forget the cached rendering (the next render is a full one)."""
        self.snapshot = None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedConversation:
        """Exactly :meth:`HFChatTokenizer.render`'s result, computed from the cache where it can be."""
        msgs = normalize_messages(messages)
        if not msgs:
            raise RenderError("cannot render an empty conversation")
        tool_list = list(tools) if tools else None
        snapshot = self.snapshot
        if snapshot is not None and snapshot.tools == tool_list:
            try:
                result, self.snapshot = _Incremental(self.chat, snapshot, msgs, tool_list, add_generation_prompt).run()
                self.incremental_renders += 1
                return result
            except _Doubt:
                pass
        return self._full(msgs, tool_list, add_generation_prompt)

    def _full(self, msgs: list[dict[str, Any]], tools: list[Any] | None, gen: bool) -> RenderedConversation:
        detail = self.chat.render_detail(msgs, tools, gen)
        self.full_renders += 1
        stable = detail.conversation.prefix_stable
        self.snapshot = Snapshot.of(detail, msgs, tools) if stable else None
        return detail.conversation


class _Incremental:
    """One incremental render (see the module docstring); raises :class:`_Doubt` to give up."""

    def __init__(
        self, chat: HFChatTokenizer, snap: Snapshot, msgs: list[dict[str, Any]], tools: list[Any] | None, gen: bool
    ) -> None:
        self.chat, self.snap, self.msgs, self.tools, self.gen = chat, snap, msgs, tools, gen
        m = len(snap.messages)
        # cell c = head (0) or message c - 1; the generation prompt is one more, always re-tokenized
        self.dirty = [False] + [i >= m or msg != snap.messages[i] for i, msg in enumerate(msgs)] + [True]
        self.text = ""
        self.bounds: list[int] = []

    def run(self) -> tuple[RenderedConversation, Snapshot]:
        """The rendering and the new snapshot."""
        with self.chat.prepared_once():  # self.msgs are fresh normalized dicts, never changed here
            self.text = self.chat.render_text(self.msgs, self.tools, self.gen)
            self.bounds = self._layout()
        tokens, token_bounds = self._tokenize()
        n = len(self.msgs)
        spans = [Span.model_construct(start=token_bounds[c], end=token_bounds[c + 1]) for c in range(1, n + 1)]
        result = RenderedConversation.model_construct(
            tokens=tokens, message_spans=spans, prefix_stable=True, unstable_reason=None
        )
        end_char, end_token = self.bounds[n + 1], token_bounds[n + 1]
        snapshot = Snapshot(
            messages=self.msgs,
            tools=self.tools,
            preamble=self.snap.preamble,
            text=self.text[:end_char],
            char_bounds=self.bounds[: n + 2],
            tokens=tokens[:end_token],
            token_bounds=token_bounds[: n + 2],
        )
        return result, snapshot

    def _layout(self) -> list[int]:
        """Character bounds of every cell in the new text, plus its end: ``[0, head, m0, …, len]``."""
        text, snap = self.text, self.snap
        head = snap.preamble if text.startswith(snap.preamble) else ""
        if head != snap.text[: snap.char_bounds[1]]:
            raise _Doubt
        bounds = [0, len(head)]
        pos = len(head)
        n = len(self.msgs)
        for i in range(n):
            if not self.dirty[i + 1]:
                piece = snap.text[snap.char_bounds[i + 1] : snap.char_bounds[i + 2]]
                if not text.startswith(piece, pos):
                    raise _Doubt
                pos += len(piece)
            else:
                last = i == n - 1 and not self.gen
                prefix = text if last else self.chat.render_text(self.msgs[: i + 1], self.tools, False)
                if len(prefix) < pos or not text.startswith(prefix):
                    raise _Doubt
                pos = len(prefix)
            bounds.append(pos)
        if not self.gen and pos != len(text):
            raise _Doubt
        bounds.append(len(text))
        return bounds

    def _runs(self) -> list[tuple[int, int]]:
        """Maximal runs ``[a, b)`` of dirty cells (the head is never dirty, so ``a >= 1``)."""
        runs: list[tuple[int, int]] = []
        c = 0
        while c < len(self.dirty):
            if self.dirty[c]:
                b = c
                while b < len(self.dirty) and self.dirty[b]:
                    b += 1
                runs.append((c, b))
                c = b
            else:
                c += 1
        return runs

    def _tokenize(self) -> tuple[list[int], list[int]]:
        """Tokens of the whole text and the token bounds of every cell (cached where unchanged)."""
        tokens: list[int] = []
        token_bounds: list[int] = []
        done = 0  # the next cell to emit
        for a, b in self._runs():
            self._emit_clean(done, a, tokens, token_bounds)
            self._emit_window(a, b, tokens, token_bounds)
            done = b
        token_bounds.append(len(tokens))
        if done != len(self.dirty) or len(token_bounds) != len(self.bounds):
            raise _Doubt  # cannot happen: the last run always holds the generation prompt cell
        return tokens, token_bounds

    def _emit_clean(self, start: int, stop: int, tokens: list[int], token_bounds: list[int]) -> None:
        """Append the cached cells ``[start, stop)``: their tokens and shifted bounds."""
        if start >= stop:
            return
        old = self.snap.token_bounds
        shift = len(tokens) - old[start]
        token_bounds.extend(t + shift for t in old[start:stop])
        tokens.extend(self.snap.tokens[old[start] : old[stop]])

    def _emit_window(self, a: int, b: int, tokens: list[int], token_bounds: list[int]) -> None:
        """Tokenize the dirty cells ``[a, b)`` between two cached context cells; append them."""
        at_end = b == len(self.dirty)  # no right context: the window runs to the end of the text
        left = a - 1
        cells = self.bounds[left : b + 1 if at_end else b + 2]  # char bounds of the window's cells
        w0, w1 = cells[0], cells[-1]
        if (w0 > 0 and cells[1] == w0) or (not at_end and cells[-1] == cells[-2]):
            raise _Doubt  # an empty context cell proves nothing about alignment
        if not (self.chat.hard_split(self.text, w0) and self.chat.hard_split(self.text, w1)):
            raise _Doubt  # the window's tokenization may depend on text outside it
        ids, offsets = self.chat.encode(self.text[w0:w1])
        tb = _char_to_token_boundaries([x - w0 for x in cells], offsets, w1 - w0)
        if tb is None or tb[0] != 0 or ids[: tb[1]] != self.snap.cell_tokens(left):
            raise _Doubt
        if not at_end and ids[tb[-2] :] != self.snap.cell_tokens(b):
            raise _Doubt
        shift = len(tokens) - tb[1]  # the left context cell is emitted already (from the cache)
        token_bounds.extend(t + shift for t in tb[1 : b - a + 1])
        tokens.extend(ids[tb[1] : tb[b - a + 1]])
