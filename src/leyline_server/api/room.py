"""Room in the KV pool: reservations before allocation, idle cache shed when it is needed.

Requests in flight hold reservations (:mod:`.admission`); idle sessions and blocks hold pinned KV
that nobody is using: cache, shed fairly (the key holding the most idle KV first, its least
recently used item first; :meth:`Room.shed`). :meth:`Room.reserve` takes a reservation and then keeps the invariant
*idle pinned KV + every reservation fits the pool* by dropping least recently used idle sessions,
so an admitted request never finds the pool taken by idle cache mid-decode (an engine that parks
idle sequences out of the pool, llama.cpp, makes that room itself). :meth:`Room.retry` is the one
"make room and retry" loop for every allocation (a turn, a session, a block).

**What a turn reserves** (:meth:`Room.headroom`). On an engine that retracts (the CPU engines),
admission needs the prompt plus ``min(max_tokens, HEADROOM)`` completion tokens; the reservation
then grows by ``HEADROOM`` whenever the tokens taken come within ``HEADROOM / 2`` of it
(:meth:`Room.grow`, never waiting, so a stream is never paused by admission), up to
``max_tokens``. The engine decodes at most ``RUN_AHEAD`` (16) tokens past those taken, so the
reservation always covers what the turn holds. When the growth of running turns takes the pool
short, the engine retracts a stream (:mod:`leyline_server.engines.retraction`). On SGLang, whose
own admission wants room for the whole generation, a turn reserves prompt + ``max_tokens``.
Whenever a turn's reservation grows or ends, idle cache that no longer fits beside the
reservations is shed (:meth:`Room.fit`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.api.admission import Admission, Ticket
from leyline_server.api.errors import APIError
from leyline_server.blocks import BlockStore
from leyline_server.contract.base import Engine
from leyline_server.contract.values import CapacityError
from leyline_server.sessions import Session, SessionStore

__all__ = ["Room", "HEADROOM"]

T = TypeVar("T")
HEADROOM = 256  # completion tokens a turn reserves ahead of those taken (module docstring)


class Room:
    """Reservations and shedding over one engine's pool; see the module docstring."""

    def __init__(self, engine: Engine, sessions: SessionStore, blocks: BlockStore, admission: Admission) -> None:
        self.engine, self.sessions, self.blocks, self.admission = engine, sessions, blocks, admission

    def shed(self, tokens: int, keep: Session | None = None) -> bool:
        """Drop idle cache holding at least ``tokens`` KV tokens, fairly between keys.

        Idle cache is every session no request is using and every block no request is reading.
        Each drop takes the least recently used item of the key that holds the most idle KV
        now, so one key's sessions or blocks cannot push out another key's smaller cache (a
        later request on a dropped session falls back to ``base_mismatch``; a directive naming
        a dropped block is refused and recomputed). ``keep`` (the session the request continues)
        is never dropped. ``False`` if nothing could go.
        """
        holdings = self._idle(keep)
        freed, dropped = 0, False
        while freed < tokens and holdings:
            owner = max(holdings, key=lambda k: sum(size for _, size, _ in holdings[k]))
            _, size, drop = holdings[owner].pop(0)
            if not holdings[owner]:
                del holdings[owner]
            drop()
            freed += size
            dropped = True
        return dropped

    def _idle(self, keep: Session | None) -> dict[str | None, list[tuple[float, int, Callable[[], None]]]]:
        """Each key's idle cache as (last used, tokens, drop), least recently used first."""
        out: dict[str | None, list[tuple[float, int, Callable[[], None]]]] = {}
        for s in self.sessions.all():
            if s is not keep and not s.users and s.handle is not None:
                out.setdefault(s.owner, []).append((s.last_used, s.handle.cached, partial(self.sessions.drop, s)))
        for b in self.blocks.all():
            if not b.users:
                out.setdefault(b.owner, []).append((b.last_used, len(b.handle.tokens), partial(self.blocks.drop, b)))
        for items in out.values():
            items.sort(key=lambda item: item[0])
        return out

    def headroom(self, max_tokens: int) -> int:
        """The completion tokens a turn reserves to start (module docstring)."""
        return min(max_tokens, HEADROOM) if self.engine.info.retracts else max_tokens

    async def reserve(self, ticket: Ticket, tokens: int, keep: Session | None = None) -> None:
        """Reserve ``tokens`` of KV for the request, then make sure they are there (idle sessions
        shed, never ``keep``: the session the request continues)."""
        await self.admission.reserve(ticket, tokens)
        self.fit(keep)

    def grow(self, ticket: Ticket, tokens: int, keep: Session | None = None) -> None:
        """Reserve ``tokens`` more for a turn that is generating (never waits), then make room."""
        self.admission.grow(ticket, tokens)
        self.fit(keep)

    def fit(self, keep: Session | None = None) -> None:
        """Shed idle cache (never ``keep``) until it fits the pool beside every reservation (an
        engine that parks idle sequences out of the pool makes that room itself)."""
        info = self.engine.info
        if info.parks_idle:
            return
        idle = sum(s.handle.cached for s in self.sessions.all() if s.handle is not None and not s.users)
        pinned = sum(len(b.handle.tokens) for b in self.blocks.all())
        excess = idle + pinned + self.admission.reserved - info.kv_capacity_tokens
        if excess > 0:
            self.shed(excess, keep=keep)

    async def retry(self, attempt: Callable[[bool], Awaitable[T]], tokens: int, keep: Session | None) -> T:
        """``attempt(True)``; while the pool is full, shed idle sessions and ``attempt(False)`` again.

        Each retry follows a shed that dropped something, so it ends; 503 only when no idle
        session is left to drop.
        """
        first = True
        while True:
            try:
                return await attempt(first)
            except CapacityError as exc:
                if not self.shed(tokens, keep=keep):
                    raise APIError(503, FallbackCode.CAPACITY.value, f"no room in the KV pool: {exc}") from exc
            first = False
