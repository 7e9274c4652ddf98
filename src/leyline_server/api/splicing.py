"""Which splice a chat request asks for: the session it continues, its directives, or (for plain
clients under ``--auto-splice``) the explanation of its prompt against the session's base."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from leyline_sdk.diff import common_prefix_length
from leyline_sdk.directives import Mode, digest
from leyline_sdk.errors import RenderError
from leyline_sdk.templates import Source, explain
from leyline_sdk.turns import decoder_of, explain_client_turn
from leyline_sdk.wire import FallbackInfo, LeylineRequest
from leyline_server.api.errors import APIError
from leyline_server.engines.base import SpliceRequest
from leyline_server.sessions import Session

if TYPE_CHECKING:
    from leyline_server.api.service import LeylineService

__all__ = ["resolve_session", "find_by_prefix", "splice_request", "auto_splice", "render_tokens"]


def resolve_session(
    service: LeylineService, ext: LeylineRequest | None, owner: str | None, prompt: list[int]
) -> tuple[Session | None, FallbackInfo | None]:
    """The session a chat request continues (or opens), and a fallback to report."""
    if ext is not None and ext.session_id:
        session = service.sessions.get(ext.session_id, owner)
        if session is not None:
            return session, None
        if ext.strict:
            raise APIError(
                404, "session_not_found", f"unknown or expired session {ext.session_id!r}", "leyline.session_id"
            )
        message = f"unknown session {ext.session_id!r} (expired, dropped or never opened): served as a new session"
        return service.sessions.open(owner, service.salt(owner)), FallbackInfo(code="base_mismatch", message=message)
    if ext is not None:
        return service.sessions.open(owner, service.salt(owner)), None
    if service.config.auto_splice:
        return find_by_prefix(service, owner, prompt) or service.sessions.open(owner, service.salt(owner)), None
    return None, None


def find_by_prefix(service: LeylineService, owner: str | None, prompt: list[int]) -> Session | None:
    """The owner's idle session sharing the longest prefix with ``prompt`` (auto-splice)."""
    best, best_len = None, 0
    for session in service.sessions.owned_by(owner):
        n = common_prefix_length(session.tokens, prompt)
        if n > best_len and session.users == 0:
            best, best_len = session, n
    return best


def splice_request(
    service: LeylineService, ext: LeylineRequest | None, session: Session, prompt: list[int]
) -> tuple[SpliceRequest | None, FallbackInfo | None, bool]:
    """What to ask the engine for: (splice request, a base fallback to report, auto-spliced)."""
    base = session.tokens
    if ext is None:  # auto-splice: the client's edits and the template's (see auto_splice)
        auto = auto_splice(service, session, base, prompt)
        return auto, None, auto is not None
    if (
        ext.base is not None
        and not ext.directives
        and (ext.base.length != len(base) or (ext.base.digest is not None and ext.base.digest != digest(base)))
    ):
        if ext.strict:
            raise APIError(409, "base_mismatch", "the client's base differs from the session's", "leyline.base")
        return (
            None,
            FallbackInfo(code="base_mismatch", message="the client's base differs from the session's"),
            False,
        )
    if not ext.directives:
        return None, None, False
    ref = ext.base
    blocks = service.blocks.resolve((d.block for d in ext.directives), session.owner)
    request = SpliceRequest(
        ext.directives, ref.length if ref else None, ref.digest if ref else None, ext.strict, prompt, blocks
    )
    return request, None, False


def auto_splice(service: LeylineService, session: Session, base: list[int], prompt: list[int]) -> SpliceRequest | None:
    """Directives for a plain client's prompt: its own edits ``amortize``, the template's by the rule.

    ``session.incoming`` (this request's messages and rendering, when the caller set it) and
    ``session.transcript`` (the request that produced the base) tell who changed what
    (``leyline_sdk.turns.explain_client_turn``); without them every edit is the client's.
    ``apply(base, D)`` is a prefix of the prompt (the rest is prefilled). Records who made each
    directive in ``session.auto_sources`` and makes this request the next one's transcript.
    """
    current = session.incoming if session.incoming and session.incoming.render.tokens == prompt else None
    previous, session.transcript, session.incoming = session.transcript, current, None
    session.auto_sources = []
    if not base or prompt[: len(base)] == base:
        return None
    decode = decoder_of(service.chat)
    if current is None:
        explained = explain(base, prompt, decode=decode, default=(Mode.AMORTIZE, Source.CLIENT))
    else:
        explained = explain_client_turn(base, previous, current, functools.partial(render_tokens, service), decode)
    session.auto_sources = [s.value for s in explained.sources]
    return SpliceRequest(explained.directives, prompt=prompt)


def render_tokens(service: LeylineService, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int] | None:
    """The prompt tokens of ``messages`` (one template render), ``None`` if the template refuses."""
    try:
        return service.chat.encode(service.chat.render_text(messages, tools, True))[0]
    except RenderError:
        return None
