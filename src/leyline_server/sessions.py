"""Sessions: cache handles a client never has to manage.

A session is an id, its owner (the API key), its cache scope (the key's salt and the session's
own private tag for approximate KV) and a pinned handle on the engine. Ids are unguessable
(``secrets.token_urlsafe``); another key's session is invisible (``get`` answers ``None`` exactly
as for an unknown id).

Sessions are bounded, never refused: when a key is at its cap, opening a session drops that key's
least recently used *idle* session; when the whole server is, the least recently used idle session
of the key holding the most sessions (its handle is released and its KV becomes ordinary evictable
cache); a session in use by a request (``users > 0``) is never dropped, even
if that leaves the store over its cap for a moment. Idle sessions also expire after ``ttl_s``.
A later request naming a dropped session is served as a new one and told so
(``base_mismatch``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.directives import digest
from leyline_server.contract.values import CacheScope, Handle

__all__ = ["Session", "SessionStore"]


@dataclass(eq=False)
class Session:
    """One conversation's server-side state."""

    id: str
    owner: str | None
    scope: CacheScope
    handle: Handle | None = None
    created: float = 0.0
    last_used: float = 0.0
    users: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set by DELETE: a turn on it stops
    # auto-splice's own record of a plain client's conversation (owned by api.conversations, opaque here)
    auto: Any = None

    @property
    def tokens(self) -> list[int]:
        """The session's base: every token of the conversation so far."""
        return list(self.handle.tokens) if self.handle is not None else []

    @property
    def digest(self) -> str:
        """``digest(tokens)``: what a client compares its own view against."""
        return digest(self.tokens)


class SessionStore:
    """Sessions by id in least-recently-used order, with per-key and global caps and a TTL."""

    def __init__(
        self,
        release: Callable[[Handle], None],
        ttl_s: float = 3600.0,
        max_sessions: int = 4096,
        max_per_key: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_sessions <= 0 or max_per_key <= 0:
            raise ValueError("ttl_s, max_sessions and max_per_key must be positive")
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._release = release
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_per_key = max_per_key
        self._clock = clock
        self.dropped = 0
        self.on_drop: Callable[[Session], None] | None = None  # told of every session dropped

    def __len__(self) -> int:
        return len(self._sessions)

    def drop(self, session: Session) -> None:
        """Forget ``session`` and release its handle (its KV becomes evictable)."""
        if self._sessions.pop(session.id, None) is not None:
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(session)
        if session.handle is not None:
            handle, session.handle = session.handle, None
            self._release(handle)

    def _expire(self) -> None:
        now = self._clock()
        for session in [s for s in self._sessions.values() if s.users == 0 and now - s.last_used > self.ttl_s]:
            self.drop(session)

    def _make_room(self, owner: str | None) -> None:
        """Drop least recently used idle sessions until ``owner`` and the server are under their caps."""
        mine = [s for s in self._sessions.values() if s.owner == owner]
        idle_mine = (s for s in mine if s.users == 0)
        excess = len(mine) - self.max_per_key + 1
        for session in list(idle_mine)[: max(excess, 0)]:
            self.drop(session)
        for _ in range(len(self._sessions) - self.max_sessions + 1):
            victim = self._from_largest_key()
            if victim is None:
                break
            self.drop(victim)

    def _from_largest_key(self) -> Session | None:
        """The least recently used idle session of the key with the most sessions (the global cap is
        fair: one key's many sessions never push out another key's few)."""
        counts: dict[str | None, int] = {}
        for s in self._sessions.values():
            counts[s.owner] = counts.get(s.owner, 0) + 1
        for owner in sorted(counts, key=lambda k: -counts[k]):
            idle = next((s for s in self._sessions.values() if s.owner == owner and s.users == 0), None)
            if idle is not None:
                return idle
        return None

    def open(self, owner: str | None, salt: str | None) -> Session:
        """A new, empty session for ``owner`` (making room first); its handle is set by the caller."""
        self._expire()
        self._make_room(owner)
        now = self._clock()
        sid = secrets.token_urlsafe(18)
        session = Session(sid, owner, CacheScope(salt=salt, private=sid), created=now, last_used=now)
        self._sessions[sid] = session
        return session

    def get(self, session_id: str, owner: str | None) -> Session | None:
        """The session, if it exists, has not expired and belongs to ``owner``."""
        self._expire()
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return None
        self.touch(session)
        return session

    def touch(self, session: Session) -> None:
        """Mark ``session`` as just used (the most recent in LRU order)."""
        session.last_used = self._clock()
        if session.id in self._sessions:
            self._sessions.move_to_end(session.id)

    @asynccontextmanager
    async def use(self, session: Session) -> AsyncIterator[Session]:
        """Hold ``session`` for one request: never dropped meanwhile, requests on it serialised."""
        session.users += 1
        try:
            async with session.lock:
                yield session
        finally:
            session.users -= 1
            self.touch(session)

    def delete(self, session_id: str, owner: str | None) -> bool:
        """Remove and release a session; ``False`` if unknown or not ``owner``'s."""
        session = self.get(session_id, owner)
        if session is None:
            return False
        self.drop(session)
        return True

    def owned_by(self, owner: str | None) -> list[Session]:
        """Live sessions of ``owner``, least recently used first."""
        self._expire()
        return [s for s in self._sessions.values() if s.owner == owner]

    def all(self) -> list[Session]:
        """Every live session (a snapshot)."""
        self._expire()
        return list(self._sessions.values())
