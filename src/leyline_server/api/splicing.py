"""Which splice a chat request with the ``leyline`` extension asks for: its session, its directives,
and whether their result fits the context (plain clients under ``--auto-splice``: :mod:`.autosplice`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from leyline_sdk.core.directives import Directive, check, digest
from leyline_sdk.core.errors import DirectiveError
from leyline_sdk.core.wire import FallbackInfo, LeylineRequest
from leyline_server.api.errors import APIError
from leyline_server.engines.base import Handle, SpliceRequest
from leyline_server.sessions import Session, SessionStore

__all__ = ["resolve_session", "splice_request", "result_length", "overflowing_directive"]


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
                404, "session_not_found", f"unknown or expired session {ext.session_id!r}", "leyline.session_id"
            )
        message = f"unknown session {ext.session_id!r} (expired, dropped or never opened): served as a new session"
        return sessions.open(owner, salt), FallbackInfo(code="base_mismatch", message=message)
    return sessions.open(owner, salt), None


def splice_request(
    named: Mapping[str, Handle], ext: LeylineRequest, session: Session, prompt: list[int]
) -> tuple[SpliceRequest | None, FallbackInfo | None]:
    """What to ask the engine for: (splice request, a base fallback to report); ``named`` holds
    the blocks the directives may name (``BlockStore.using``)."""
    base = session.tokens
    if (
        ext.base is not None
        and not ext.directives
        and (ext.base.length != len(base) or (ext.base.digest is not None and ext.base.digest != digest(base)))
    ):
        if ext.strict:
            raise APIError(409, "base_mismatch", "the client's base differs from the session's", "leyline.base")
        return None, FallbackInfo(code="base_mismatch", message="the client's base differs from the session's")
    if not ext.directives:
        return None, None
    ref = ext.base
    request = SpliceRequest(
        ext.directives, ref.length if ref else None, ref.digest if ref else None, ext.strict, prompt, named
    )
    return request, None


def result_length(base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> int | None:
    """``len(apply(base, directives))`` without applying them; ``None`` when they do not apply to
    the base at all (the splice reports that as ``span_invalid``)."""
    deltas = _deltas(base_length, directives, blocks)
    return None if deltas is None else base_length + sum(deltas)


def overflowing_directive(
    base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle], limit: int
) -> tuple[int, int] | None:
    """``(i, length)`` when ``apply(base, directives)`` would be longer than ``limit`` tokens: ``i`` is
    the first directive whose running result passes it. ``None`` when it fits or does not apply."""
    deltas = _deltas(base_length, directives, blocks)
    if deltas is None or base_length + sum(deltas) <= limit:
        return None
    running = base_length
    for i, delta in enumerate(deltas):
        running += delta
        if running > limit:
            return i, base_length + sum(deltas)
    raise AssertionError("the last running length is the total")


def _deltas(base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> list[int] | None:
    try:
        check(directives, base_length)
    except DirectiveError:
        return None
    return _deltas_of(directives, blocks)


def _deltas_of(directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> list[int]:
    """How much each directive changes the length (a named block's tokens stand in for an empty replacement)."""
    out = []
    for d in directives:
        block = blocks.get(d.block) if d.block is not None else None
        size = len(block.tokens) if block is not None and not d.replacement else len(d.replacement)
        out.append(size - (d.end - d.start))
    return out
