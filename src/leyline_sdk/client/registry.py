"""What a Leyline client and its copies share: the session registry, the block registry, the probe.

``client.with_options(...)`` / ``client.copy(...)`` build a new client (openai-python's way);
a copy that talks to the same ``base_url`` with the same API key shares its parent's
:class:`ClientState` — the sessions it remembers, the blocks it made, whether the server speaks
Leyline — so a conversation continued through a copy (``with_options(timeout=5)``, or a framework
that copies the client per call) continues the same server-side session. A copy for another
server or key starts with a state of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from leyline_sdk.explain.identity import marks_of, opening
from leyline_sdk.session.blocks import Blocks
from leyline_sdk.session.gateway import DEFAULT_ROUTING_HEADER, Gateway
from leyline_sdk.session.port import LeylineRoutes
from leyline_sdk.session.renderer import LeylineProbe
from leyline_sdk.session.session import LeylineSession

__all__ = ["ClientState", "SessionRegistry"]


class SessionRegistry:
    """The sessions a client remembers: at most ``max_sessions``, least recently used first out.

    A forgotten session's server-side session is deleted at the client's next call
    (:meth:`reap`); :meth:`close` deletes all of them.
    """

    def __init__(self, max_sessions: int = 256) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, LeylineSession] = OrderedDict()  # LRU: least recent first
        self._evicted: list[LeylineSession] = []

    @property
    def sessions(self) -> list[LeylineSession]:
        """The sessions remembered, least recently used first."""
        return list(self._sessions.values())

    def touch(self, session: LeylineSession) -> None:
        """Mark ``session`` most recently used; forget the least recent beyond ``max_sessions``."""
        self._sessions[id(session)] = session
        self._sessions.move_to_end(id(session))
        while len(self._sessions) > self.max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._evicted.append(evicted)

    def find(self, messages: Sequence[Mapping[str, Any]], cache_key: str | None = None) -> LeylineSession | None:
        """The remembered session ``messages`` continue, found by the first of these that finds one:

        1. the session whose full history is the longest prefix of ``messages`` (no edit);
        2. the one session whose latest reply (the server's, by its mark: tool-call ids, else a
           digest of its text; :mod:`leyline_sdk.explain.identity`) ``messages`` carry — the agent
           edited its history (cleared, shortened, removed or inserted messages) but kept that reply;
        3. the one session with the same ``prompt_cache_key`` and the same opening.

        Two sessions equally likely (two conversations that opened and were answered alike) mean
        none: the call opens a new session, never a wrong one.
        """
        best, best_n = None, 0
        for session in self._sessions.values():
            n = session.matches(messages)
            if n > best_n:
                best, best_n = session, n
        found = best if best is not None else self._by_reply(messages) or self._by_key(messages, cache_key)
        if found is not None:
            self.touch(found)
        return found

    def _by_reply(self, messages: Sequence[Mapping[str, Any]]) -> LeylineSession | None:
        for mark in reversed(marks_of(messages)):
            found = [s for s in self._sessions.values() if s.server.replies and s.server.replies[-1] == mark]
            if found:
                return found[0] if len(found) == 1 else None
        return None

    def _by_key(self, messages: Sequence[Mapping[str, Any]], cache_key: str | None) -> LeylineSession | None:
        if cache_key is None:
            return None
        first = opening(messages)
        found = [s for s in self._sessions.values() if s.cache_key == cache_key and opening(s.history) == first]
        return found[0] if len(found) == 1 else None

    async def reap(self) -> None:
        """Delete the server-side sessions of sessions forgotten since (best effort)."""
        evicted, self._evicted = self._evicted, []
        for session in evicted:
            if id(session) not in self._sessions:
                await close_quietly(session)

    async def close(self) -> None:
        """Delete every remembered session on the server (404s and errors ignored).

        The sessions stay remembered (their stats and histories remain readable).
        """
        await self.reap()
        for session in self.sessions:
            await close_quietly(session)


async def close_quietly(session: LeylineSession) -> None:
    """``session.aclose()``; a server that is gone or refuses must not fail a client's close."""
    try:
        await session.aclose()
    except openai.APIError:
        pass


class ClientState:
    """Sessions, blocks and the Leyline probe of one client and the copies that share them.

    ``key`` is the (base URL, API key) it serves; a copy with another key gets a new state.
    ``behind_router`` / ``routing_header``: see :mod:`leyline_sdk.session.gateway` (the probe holds the mode).
    """

    def __init__(
        self,
        routes: LeylineRoutes,
        key: tuple[str, str],
        max_sessions: int = 256,
        behind_router: bool = False,
        routing_header: str = DEFAULT_ROUTING_HEADER,
    ) -> None:
        self.key = key
        self.registry = SessionRegistry(max_sessions)
        gateway = Gateway(routing_header, "a gateway (behind_router=True)") if behind_router else None
        self.probe = LeylineProbe(routes, base_url=key[0], routing_header=routing_header, gateway=gateway)
        self.blocks = Blocks(routes)

    @classmethod
    def share(
        cls,
        parent: ClientState | None,
        routes: LeylineRoutes,
        key: tuple[str, str],
        max_sessions: int,
        behind_router: bool = False,
        routing_header: str = DEFAULT_ROUTING_HEADER,
    ) -> ClientState:
        """``parent`` if it serves ``key`` (a copy of a client), else a new state."""
        if parent is not None and parent.key == key:
            return parent
        return cls(routes, key, max_sessions, behind_router, routing_header)
