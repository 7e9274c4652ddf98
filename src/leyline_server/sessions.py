"""Sessions: id -> base tokens (prompt + generated), pinned radix path, owner; with a TTL and a cap.

Ids are unguessable (``secrets.token_urlsafe``). A session belongs to the API key that created it
and is invisible to any other (``get`` answers ``None`` exactly as for an unknown id). Expired
sessions and those pushed out by the cap are released through ``on_release`` (which unpins their
cache path, on the engine's thread).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from leyline_sdk.directives import digest
from leyline_server.engines.embedded.engine import Pinned

__all__ = ["Session", "SessionStore"]


@dataclass
class Session:
    """One conversation's server-side state."""

    id: str
    owner: str | None
    pinned: Pinned
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> list[int]:
        """The session's base: every token of the conversation so far."""
        return self.pinned.tokens

    @property
    def digest(self) -> str:
        """``digest(tokens)``: what a client compares its own view against."""
        return digest(self.pinned.tokens)


class SessionStore:
    """Sessions by id, least recently used first; expiry after ``ttl_s``, at most ``max_sessions``."""

    def __init__(
        self,
        on_release: Callable[[Pinned], None],
        ttl_s: float = 3600.0,
        max_sessions: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_sessions <= 0:
            raise ValueError("ttl_s and max_sessions must be positive")
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._on_release = on_release
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self) -> None:
        now = self._clock()
        for sid in [s.id for s in self._sessions.values() if now - s.last_used > self.ttl_s]:
            self._on_release(self._sessions.pop(sid).pinned)

    def create(self, owner: str | None, pinned: Pinned) -> Session:
        """Store a new session for ``pinned`` (the store now owns its pin)."""
        self._expire()
        while len(self._sessions) >= self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            self._on_release(oldest.pinned)
        now = self._clock()
        session = Session(secrets.token_urlsafe(18), owner, pinned, now, now)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, owner: str | None) -> Session | None:
        """The session, if it exists, has not expired and belongs to ``owner``."""
        self._expire()
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return None
        session.last_used = self._clock()
        self._sessions.move_to_end(session_id)
        return session

    def update(self, session: Session, pinned: Pinned) -> None:
        """Replace the session's pin (the old one was consumed by the engine)."""
        session.pinned = pinned
        session.last_used = self._clock()

    def delete(self, session_id: str, owner: str | None) -> bool:
        """Remove and release a session; ``False`` if unknown or not ``owner``'s."""
        session = self.get(session_id, owner)
        if session is None:
            return False
        del self._sessions[session_id]
        self._on_release(session.pinned)
        return True

    def all(self) -> list[Session]:
        """Every live session (a snapshot; expired ones are dropped first)."""
        self._expire()
        return list(self._sessions.values())

    def count(self, owner: str | None) -> int:
        """Live sessions of ``owner``."""
        self._expire()
        return sum(1 for s in self._sessions.values() if s.owner == owner)
