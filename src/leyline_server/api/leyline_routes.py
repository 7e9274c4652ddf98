"""The Leyline routes: ``/v1/leyline/tokenize`` and the sessions API."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from leyline_sdk.core.wire import BaseRef, DirectivesResult, SessionInfo
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import APIError
from leyline_server.api.schemas import DirectivesRequest, SessionCreateRequest, TokenizeRequest
from leyline_server.sessions import Session

__all__ = ["router"]

router = APIRouter(prefix="/v1/leyline")


def _info(session: Session, with_tokens: bool) -> dict[str, Any]:
    info = SessionInfo(
        id=session.id,
        base=BaseRef(length=len(session.tokens), digest=session.digest),
        tokens=session.tokens if with_tokens else None,
    )
    return info.model_dump(mode="json", exclude_none=True)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, key: Owner, service: Service) -> dict[str, Any]:
    """Messages (+ tools) -> token ids, each message's span, and whether the template is prefix-stable."""
    async with service.admission.slot(key):
        rendered, _ = await service.render.spans(key, body.messages, body.tools, body.add_generation_prompt)
    return {
        "tokens": rendered.tokens,
        "message_spans": [{"start": s.start, "end": s.end} for s in rendered.message_spans],
        "prefix_stable": rendered.prefix_stable,
        "unstable_reason": rendered.unstable_reason,
    }


@router.post("/sessions")
async def create_session(body: SessionCreateRequest, key: Owner, service: Service) -> dict[str, Any]:
    """Open a session from ``messages`` or ``tokens`` (prefilled now)."""
    if (body.messages is None) == (body.tokens is None):
        raise APIError(400, "invalid_request", "give exactly one of 'messages' and 'tokens'")
    async with service.admission.slot(key) as ticket:
        if body.tokens is not None:
            tokens = body.tokens
        else:
            tokens = await service.render.tokens(key, body.messages or [], body.tools, False)
        return _info(await service.open_session(key, tokens, ticket), with_tokens=True)


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, key: Owner, service: Service) -> dict[str, Any]:
    """A session's base (length, digest, tokens), once the requests in flight on it are done.

    A base read during a turn would be that turn's prompt without its answer: a client that
    resynchronises after abandoning a stream must see where the turn really left the session.
    """
    session = service.get_session(session_id, key)
    async with service.sessions.use(session):
        pass  # wait for requests in flight on it
    return _info(session, with_tokens=True)


@router.delete("/sessions/{session_id}")
async def delete_session(session_id: str, key: Owner, service: Service) -> dict[str, Any]:
    """Close a session (its KV becomes ordinary evictable cache); a turn decoding on it stops at
    its next step (a stream ends, read or not) and keeps what it generated until the drop."""
    session = service.get_session(session_id, key)
    session.ended.set()
    async with service.sessions.use(session):
        pass  # the turn in flight on it has ended
    service.sessions.drop(session)
    return {"id": session_id, "object": "leyline.session.deleted", "deleted": True}


@router.post("/sessions/{session_id}/directives")
async def directives(
    session_id: str,
    body: DirectivesRequest,
    key: Owner,
    service: Service,
) -> dict[str, Any]:
    """Splice a session without generating (e.g. while a tool runs)."""
    async with service.admission.slot(key) as ticket:
        session, report = await service.splice_session(session_id, key, body.directives, body.base, body.strict, ticket)
    exact = session.handle.exact if session.handle else 0
    result = DirectivesResult(
        id=session.id,
        base=BaseRef(length=len(session.tokens), digest=session.digest),
        **report.model_dump(exclude={"approximate_tokens"}),
        approximate_tokens=max(0, len(session.tokens) - exact),
    )
    return result.model_dump(mode="json")
