"""Fair admission: per-key limits on requests in flight and on the KV they may hold.

Every request that does work holds a :class:`Ticket` (:meth:`Admission.slot`) while it runs:
one of its key's ``max_concurrent`` slots. Before it allocates KV it reserves on that ticket what
it needs to start (:meth:`Admission.reserve`: the prompt and a bounded headroom for its first
tokens, plus the base a splice copies from; the rule is :mod:`.room`'s), and the reservation grows
as its tokens are generated (:meth:`Admission.grow`, which never waits); it ends with the ticket
(a stream's when the stream ends). A reservation is granted when

* the pool has room: the reservations in flight plus this one fit ``capacity`` tokens, and
* the key stays within its share, ``min(share, 1 / active keys) × capacity`` (a key is *active*
  while it has requests in flight or waiting). A key with nothing reserved may always start one
  request, so a request as long as the context is never refused for its size.

What cannot be granted waits, first come first served: a waiter blocked by the pool's room holds
back everyone behind it (no starvation of long requests); one blocked by its own key's limits
does not. Past ``timeout_s`` the request gets 429 ``rate_limit_exceeded`` with ``Retry-After``.
A key over its share therefore waits for its own requests, never another key's 503. Idle
sessions and blocks are cache, not reservations: the service sheds them to make room.

Growth may take the reservations past the pool: new requests then wait for room as usual, and
the engine, whose pool is what really runs short, retracts a running stream (resumed later)
instead of refusing anyone. No request is refused for another's unused ``max_tokens``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from leyline_server.api.errors import APIError

__all__ = ["Admission", "Ticket"]


@dataclass
class _Key:
    """One key's requests in flight (``slots``), their reserved KV tokens, and its waiters."""

    slots: int = 0
    reserved: int = 0
    waiting: int = 0


@dataclass
class Ticket:
    """A request's admission: its key, and the KV tokens it has reserved so far."""

    key: str | None
    reserved: int = 0
    state: _Key = field(default_factory=_Key, repr=False)


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    tokens: int  # 0: waiting for a slot
    future: asyncio.Future[None]


class Admission:
    """Slots and KV reservations per key; see the module docstring."""

    def __init__(
        self, capacity: int, max_concurrent: int, share: float, timeout_s: float, retry_after_s: int = 1
    ) -> None:
        if capacity <= 0 or max_concurrent <= 0 or not 0 < share <= 1 or timeout_s < 0:
            raise ValueError("capacity and max_concurrent must be positive, share in (0, 1], timeout_s >= 0")
        self.capacity, self.max_concurrent, self.share = capacity, max_concurrent, share
        self.timeout_s, self.retry_after_s = timeout_s, retry_after_s
        self.reserved = 0
        self._keys: dict[str | None, _Key] = {}
        self._queue: list[_Waiter] = []

    def key_share(self) -> int:
        """The KV tokens one key may reserve now."""
        active = sum(1 for k in self._keys.values() if k.slots or k.waiting)
        return int(self.capacity * min(self.share, 1 / max(active, 1)))

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot or a reservation."""
        return len(self._queue)

    def in_flight(self, key: str | None) -> tuple[int, int]:
        """(requests, reserved tokens) of ``key`` in flight."""
        state = self._keys.get(key)
        return (state.slots, state.reserved) if state else (0, 0)

    @asynccontextmanager
    async def slot(self, key: str | None) -> AsyncIterator[Ticket]:
        """Hold one of ``key``'s slots for the block (waiting, then 429, when all are taken)."""
        state = self._keys.setdefault(key, _Key())
        ticket = Ticket(key, state=state)
        try:
            await self._acquire(_Waiter(ticket, 0, asyncio.get_running_loop().create_future()))
        except BaseException:
            self._forget_idle(key)
            raise
        try:
            yield ticket
        finally:
            state.slots -= 1
            self._unreserve(ticket)
            self._forget_idle(key)
            self._pump()

    async def reserve(self, ticket: Ticket, tokens: int) -> None:
        """Reserve ``tokens`` more KV tokens (at most the pool) on ``ticket`` (waiting, then 429)."""
        tokens = min(max(tokens, 1), self.capacity - ticket.reserved)
        if tokens > 0:
            await self._acquire(_Waiter(ticket, tokens, asyncio.get_running_loop().create_future()))

    def grow(self, ticket: Ticket, tokens: int) -> None:
        """Reserve ``tokens`` more on a running ticket at once, past the pool or its key's share if
        need be (its tokens are being generated: nothing waits for them; see the module docstring)."""
        if tokens > 0:
            ticket.reserved += tokens
            ticket.state.reserved += tokens
            self.reserved += tokens

    def _forget_idle(self, key: str | None) -> None:
        state = self._keys.get(key)
        if state is not None and not (state.slots or state.waiting):
            del self._keys[key]

    def _unreserve(self, ticket: Ticket) -> None:
        ticket.state.reserved -= ticket.reserved
        self.reserved -= ticket.reserved
        ticket.reserved = 0

    # -- waiting ------------------------------------------------------------------------------------
    def _blocker(self, w: _Waiter) -> str | None:
        """Why ``w`` cannot be granted now (``"room"``, ``"share"``, ``"slots"``), or ``None``."""
        state = w.ticket.state
        if not w.tokens:
            return "slots" if state.slots >= self.max_concurrent else None
        if self.reserved + w.tokens > self.capacity:
            return "room"
        if state.reserved and state.reserved + w.tokens > self.key_share():
            return "share"
        return None

    def _grant(self, w: _Waiter) -> None:
        if w.tokens:
            w.ticket.reserved += w.tokens
            w.ticket.state.reserved += w.tokens
            self.reserved += w.tokens
        else:
            w.ticket.state.slots += 1
        if not w.future.done():
            w.future.set_result(None)

    def _pump(self) -> None:
        """Grant waiters in arrival order; one blocked by the pool's room holds back the rest."""
        for w in list(self._queue):
            why = self._blocker(w)
            if why == "room":
                return
            if why is None:
                self._queue.remove(w)
                self._grant(w)

    async def _acquire(self, w: _Waiter) -> None:
        state = w.ticket.state
        if not self._queue and self._blocker(w) is None:
            self._grant(w)
            return
        self._queue.append(w)
        state.waiting += 1
        try:
            self._pump()
            await asyncio.wait({w.future}, timeout=self.timeout_s)
        except BaseException:
            self._abandon(w)
            raise
        finally:
            state.waiting -= 1
        if not w.future.done():
            self._abandon(w)
            raise self._refusal(w)

    def _abandon(self, w: _Waiter) -> None:
        """Leave the queue; a grant that came meanwhile is given back."""
        if w in self._queue:
            self._queue.remove(w)
        elif w.future.done() and not w.tokens:
            w.ticket.state.slots -= 1
        elif w.future.done():
            w.ticket.reserved -= w.tokens
            w.ticket.state.reserved -= w.tokens
            self.reserved -= w.tokens
        if not w.future.done():
            w.future.cancel()
        self._pump()

    def _refusal(self, w: _Waiter) -> APIError:
        state = w.ticket.state
        if not w.tokens:
            why = f"{state.slots} requests of this key in flight (at most {self.max_concurrent})"
        else:
            why = (
                f"{w.tokens} KV tokens asked; this key holds {state.reserved} (its share now: {self.key_share()}), "
                f"the pool {self.reserved} of {self.capacity}"
            )
        message = f"waited {self.timeout_s:g} s for admission: {why}; retry later"
        return APIError(429, "rate_limit_exceeded", message, None, {"Retry-After": str(self.retry_after_s)})
