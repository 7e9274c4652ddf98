"""Which session a chat turn continues, and which splice it asks for (steps 5 and 7 of :mod:`.pipeline`).

Three kinds of turn:

* **extension** — the request carries ``leyline``: its ``session_id`` (an unknown one is served as a
  new session and reported as ``base_mismatch``; 404 when strict) and its directives;
* **recognised** — a plain request the server recognised as the continuation of one of the key's
  conversations (:mod:`.conversations`): that conversation's session, the edits explained there;
* **plain** — neither: no session; the prefix cache reuses what it can (exact KV only).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol

from leyline_sdk.core.directives import digest
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import FallbackInfo, LeylineRequest
from leyline_server.api.config import ServerConfig
from leyline_server.api.conversations import Conversations, Prompt
from leyline_server.api.errors import APIError
from leyline_server.api.limits import check_directives
from leyline_server.blocks import BlockStore
from leyline_server.contract.values import Handle, SpliceRequest
from leyline_server.sessions import Session, SessionStore


class Stores(Protocol):
    """What choosing a session needs of the service: its stores, its config, the key's salt."""

    sessions: SessionStore
    blocks: BlockStore
    conversations: Conversations
    config: ServerConfig

    def salt(self, owner: str | None) -> str | None:
        """The prefix-cache partition of ``owner``."""
        ...


__all__ = [
    "Choice",
    "choose_session",
    "held_session",
    "resolve_session",
    "directives_request",
]


@dataclass
class Choice:
    """What kind of turn a request is (see the module docstring), the session to keep from being shed
    while the turn reserves its KV, and the fallback to report (set once the session is resolved)."""

    kind: str  # "extension" | "recognised" | "plain"
    keep: Session | None = None
    fallback: FallbackInfo | None = None

    @property
    def plain(self) -> bool:
        """Whether the turn has no session."""
        return self.kind == "plain"


def choose_session(service: Stores, ext: LeylineRequest | None, owner: str | None, prompt: Prompt) -> Choice:
    """The kind of turn ``prompt`` is; the extension's directives checked against the limits first."""
    if ext is not None:
        check_directives(service.config, ext.directives, "leyline.directives")
        own = service.sessions.get(ext.session_id, owner) if ext.session_id else None
        return Choice("extension", keep=own)
    if prompt.auto is not None:
        return Choice("recognised", keep=prompt.auto.session)
    return Choice("plain")


async def held_session(
    service: Stores,
    stack: AsyncExitStack,
    choice: Choice,
    ext: LeylineRequest | None,
    owner: str | None,
    prompt: Prompt,
) -> tuple[Session, Mapping[str, Handle]]:
    """The turn's session, held for the turn (its lock and the blocks its directives name, released
    by ``stack``), and those blocks. A recognised conversation that another request moved on
    meanwhile gets a new session."""
    sessions, salt = service.sessions, service.salt(owner)
    auto = prompt.auto
    if ext is not None:
        session, choice.fallback = resolve_session(sessions, salt, ext, owner)
    else:
        assert auto is not None
        session = auto.session or sessions.open(owner, salt)
    held = AsyncExitStack()
    stack.push_async_callback(held.aclose)
    named = held.enter_context(service.blocks.using((d.block for d in ext.directives) if ext else (), owner))
    await held.enter_async_context(sessions.use(session))
    if auto is not None and auto.session is not None and not service.conversations.continues(session, auto):
        await held.aclose()  # another request moved that conversation on: a new session
        auto.session, session = None, sessions.open(owner, salt)
        await held.enter_async_context(sessions.use(session))
    return session, named


def resolve_session(
    sessions: SessionStore, salt: str | None, ext: LeylineRequest, owner: str | None
) -> tuple[Session, FallbackInfo | None]:
    """The session a chat request continues (or opens), and a fallback to report."""
    if ext.session_id:
        session = sessions.get(ext.session_id, owner)
        if session is not None:
            return session, None
        if ext.strict:
            raise APIError(
                404,
                FallbackCode.SESSION_NOT_FOUND.value,
                f"unknown or expired session {ext.session_id!r}",
                "leyline.session_id",
            )
        message = f"unknown session {ext.session_id!r} (expired, dropped or never opened): served as a new session"
        return sessions.open(owner, salt), FallbackInfo(code=FallbackCode.BASE_MISMATCH.value, message=message)
    return sessions.open(owner, salt), None


def directives_request(
    named: Mapping[str, Handle], ext: LeylineRequest, session: Session, prompt: list[int]
) -> tuple[SpliceRequest | None, FallbackInfo | None]:
    """The splice a client's own directives ask the engine for: (splice request, a base fallback
    to report); ``named`` holds the blocks the directives may name (``BlockStore.using``)."""
    base = session.tokens
    if (
        ext.base is not None
        and not ext.directives
        and (ext.base.length != len(base) or (ext.base.digest is not None and ext.base.digest != digest(base)))
    ):
        if ext.strict:
            raise APIError(
                409, FallbackCode.BASE_MISMATCH.value, "the client's base differs from the session's", "leyline.base"
            )
        return None, FallbackInfo(
            code=FallbackCode.BASE_MISMATCH.value, message="the client's base differs from the session's"
        )
    if not ext.directives:
        return None, None
    ref = ext.base
    request = SpliceRequest(
        ext.directives, ref.length if ref else None, ref.digest if ref else None, ext.strict, prompt, named
    )
    return request, None
