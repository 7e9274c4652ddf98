"""A prefilled turn as a route reads it: decode (step 8 of :mod:`.pipeline`), report (step 9), close.

:class:`OpenTurn` is what :meth:`~leyline_server.api.pipeline.PreparedTurn.prefill` returns: the
engine's turn with its decoder, sampling parameters, admission ticket and the stack of what it
holds (the session's lock, the admission slot), so that closing it keeps or releases them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import LeylineResult
from leyline_server.api.admission import Ticket
from leyline_server.api.completion_shapes import logprob_entry, usage
from leyline_server.api.decoder import Outcome, TextDecoder
from leyline_server.api.errors import APIError
from leyline_server.api.room import HEADROOM
from leyline_server.api.service import ChatTurn, LeylineService
from leyline_server.api.timings import Clock
from leyline_server.api.turn_report import report_headers, turn_result
from leyline_server.contract.values import CapacityError, SamplingParams

__all__ = ["OpenTurn", "Delta"]


@dataclass(frozen=True)
class Delta:
    """One decode step as a route shows it: the text now safe to show, and its logprobs entry."""

    text: str
    logprob: dict[str, Any] | None = None


@dataclass
class OpenTurn:
    """A turn that is prefilled and ready to decode; see the module docstring (steps 8 and 9)."""

    service: LeylineService
    chat: ChatTurn
    params: SamplingParams
    decoder: TextDecoder
    stack: AsyncExitStack
    outcome: Outcome | None = None
    rest: str = ""  # the outcome's content not shown by any delta yet
    capped_to: int | None = None  # the completion limit, when the asked one was capped to the room left
    clock: Clock | None = None
    ticket: Ticket | None = None  # the admission ticket the turn's KV is reserved on
    granted: int = 0  # completion tokens reserved so far (grown as they are taken: :meth:`_grow`)
    _closed: bool = field(default=False, repr=False)
    _decoding: AsyncGenerator[Delta, None] | None = field(default=None, repr=False)

    def deltas(self) -> AsyncGenerator[Delta, None]:
        """Decode; yield each step's safe text (``""`` while held back) and logprobs entry.

        Sets :attr:`outcome` and :attr:`rest` once decoding ends. A pool that runs out mid-decode
        is a 503 ``capacity`` (:class:`APIError`). :meth:`close` closes the iterator if its reader
        dropped it unfinished (a route's generator closed at a ``yield``: Python does not close
        the loop it was in).
        """
        self._decoding = self._deltas()
        return self._decoding

    async def _deltas(self) -> AsyncGenerator[Delta, None]:
        service, params, decoder = self.service, self.params, self.decoder
        reason: str | None = None
        try:
            async with aclosing(service.engine.stream(self.chat.turn, params)) as steps:
                async for step in steps:
                    if self.clock is not None and "total" not in self.chat.timings:
                        self.chat.timings.update(self.clock.first_token())
                    self._grow(len(self.chat.turn.generated))
                    text = decoder.push(step.token)
                    reason = step.finish_reason
                    entry = logprob_entry(service.tokenizer, step) if params.logprobs else None
                    yield Delta(text, entry)
                    if decoder.stopped or (self.ended is not None and self.ended.is_set()):
                        break
        except CapacityError as exc:  # the pool ran out mid-decode: no room, not a bug
            raise APIError(503, FallbackCode.CAPACITY.value, f"the KV pool ran out while decoding: {exc}") from exc
        self.outcome = decoder.outcome(reason)
        self.rest = decoder.rest(self.outcome)
        chat = self.chat
        if chat.auto is not None and chat.session is not None:  # the reply recognises the next request
            service.conversations.replied(chat.session, self.outcome.message)

    def _grow(self, taken: int) -> None:
        """Keep ``HEADROOM / 2`` reserved completion tokens ahead of the ``taken`` ones, growing by
        ``HEADROOM`` up to ``max_tokens`` (:mod:`.room`)."""
        limit = self.params.max_tokens
        if self.ticket is None or self.granted >= limit or taken + HEADROOM // 2 < self.granted:
            return
        more = min(HEADROOM, limit - self.granted)
        self.service.room.grow(self.ticket, more, keep=self.chat.session)
        self.granted += more

    @property
    def ended(self) -> asyncio.Event | None:
        """Set when the turn's session is deleted: decoding stops, a stream ends (``None``: no session)."""
        return self.chat.session.ended if self.chat.session is not None else None

    async def run(self) -> Outcome:
        """Decode to the end without showing anything (a whole answer); the outcome."""
        async for _ in self.deltas():
            pass
        assert self.outcome is not None
        return self.outcome

    def result(self) -> LeylineResult:
        """The ``leyline`` field: session, base, what was reused, rotated and prefilled, fallback."""
        return turn_result(self.chat)

    def usage(self) -> dict[str, Any]:
        """OpenAI's ``usage`` of the turn so far (``cached_tokens``: reused + rotated prompt tokens)."""
        return usage(self.chat.turn)

    def headers(self) -> dict[str, str]:
        """What the turn did to the cache, as response headers (for protocols without a ``leyline`` field)."""
        out = report_headers(self.result())
        if self.capped_to is not None:
            out["x-leyline-max-tokens-capped"] = str(self.capped_to)
        return out

    async def close(self) -> None:
        """End decoding, then keep the session's new base (or release a plain turn's cache) and free
        the admission slot.

        Decoding ends first: a reader that dropped :meth:`deltas` unfinished (a stream closed while
        its write waited on the client) left the engine's stream open, and the engine commits the
        delivered tokens only when that stream closes. Closing it here, before the session is let
        go, means the next request on the session (or a read of its base) finds it where the
        stream left it, never the prompt without its answer (issue 43's ``base_mismatch``).
        """
        if self._closed:
            return
        self._closed = True
        decoding, self._decoding = self._decoding, None
        try:
            if decoding is not None and not getattr(decoding, "ag_running", False):  # (running: it ends itself)
                await decoding.aclose()
        finally:
            await self.stack.aclose()
            self.service.room.fit()  # the session it leaves idle must fit beside the reservations
