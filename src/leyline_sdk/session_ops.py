"""A session's requests other than a turn: splice now, resynchronise, refusals, deletion.

Split from :mod:`leyline_sdk.session` (which prepares and records turns); these functions act
on a :class:`~leyline_sdk.session.LeylineSession`'s base bookkeeping through its routes:

* :func:`splice_now` — ``session.sync_edits()``: the policies' edits sent as directives without
  generating (``POST /leyline/sessions/{id}/directives``), e.g. while a tool runs;
* :func:`resync` — after a turn whose answer was never read (a stream closed early, a request
  that failed), the server's base (``GET /leyline/sessions/{id}``) tells whether it moved;
* :func:`refused` — a strict request the server refused becomes a ``SpliceFallbackError``;
* :func:`delete` — ``DELETE /leyline/sessions/{id}``, a 404 being fine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import openai

from leyline_sdk.blocks import with_repair
from leyline_sdk.directives import Directive, apply, digest
from leyline_sdk.fallback import SpliceFallbackError
from leyline_sdk.rendering import RenderedConversation
from leyline_sdk.routes import LeylineRoutes
from leyline_sdk.stats import TurnStats, _Turn
from leyline_sdk.validation import check_tools
from leyline_sdk.wire import BaseRef, DirectivesResult, SessionInfo

if TYPE_CHECKING:
    from leyline_sdk.session import LeylineSession

__all__ = ["splice_now", "resync", "refused", "delete"]


async def splice_now(session: LeylineSession, tools: Sequence[Mapping[str, Any]] | None) -> TurnStats | None:
    """``session.sync_edits(tools)``: see there (behind a gateway: left to the next turn)."""
    if session.session_id is None or session.gateway is not None:
        return None
    started = time.perf_counter()
    if session._on_use is not None:
        session._on_use(session)
    session._fallback_code = None
    tools = check_tools(tools) if tools is not None else session.tools
    effective, modes, report = session._run_policies(tools)
    prompt = await session.renderer.render(effective, tools)
    planned = session._directives(effective, prompt, modes, turn=False) if prompt is not None else None
    if not planned or not planned[0] or session.base_tokens is None:
        return None
    directives, seen = planned
    directives = with_repair(directives, session.seam_repair)
    stats = TurnStats(
        turn=len(session.stats) + 1,
        directives=len(directives),
        cleared=len(report.cleared),
        removed_chars=report.removed_chars,
    )
    await _send_directives(session, directives, seen, stats)
    stats.elapsed_ms = (time.perf_counter() - started) * 1e3
    session.stats.append(stats)
    return stats


async def _send_directives(
    session: LeylineSession, directives: list[Directive], seen: RenderedConversation, stats: TurnStats
) -> None:
    assert session.base_tokens is not None and session.session_id is not None
    body = {
        "base": BaseRef(length=len(session.base_tokens), digest=session._base_digest).model_dump(),
        "directives": [d.model_dump(mode="json") for d in directives],
        "strict": session.strict,
    }
    try:
        raw = await session.routes.post(f"/leyline/sessions/{session.session_id}/directives", body)
    except openai.NotFoundError as exc:
        session.session_id = None
        session._forget_base()
        stats.fallback = "session_not_found"
        if session.strict:
            raise SpliceFallbackError("session_not_found", str(exc)) from exc
        return
    result = DirectivesResult.model_validate(raw)
    stats.count(result)
    stats.fallback = result.fallback.code if result.fallback else None
    session.last_directives = directives
    new_base = apply(session.base_tokens, directives)
    new_digest = digest(new_base)
    if result.base.digest == new_digest:
        session._adopt(new_base, new_digest, session.effective[: len(session._seen)], seen)
    elif result.base.digest != session._base_digest:  # neither the old nor the new base: unknown
        session._forget_base()


async def resync(session: LeylineSession, sent: _Turn) -> None:
    """After ``sent`` went unrecorded: adopt the server's base if it is ``sent``'s prompt plus
    generated tokens, keep ours if it did not move, else forget it (the next request then sends
    no directives). A session the server no longer has starts over."""
    if session.session_id is None or sent.prompt is None:
        return
    try:
        info = SessionInfo.model_validate(await session.routes.get(f"/leyline/sessions/{session.session_id}"))
    except openai.NotFoundError:
        session.session_id = None
        session._forget_base()
        return
    tokens = info.tokens or []
    if info.base.digest != digest(tokens) or tokens == session.base_tokens:
        return
    if tokens[: len(sent.prompt.tokens)] == sent.prompt.tokens:
        session._adopt(tokens, info.base.digest, list(sent.effective), sent.prompt)
    else:
        session._forget_base()


def refused(session: LeylineSession, exc: openai.APIStatusError) -> Exception:
    """What to raise for an error answer to ``session``'s request.

    A strict request's splice refused by the server — 404 ``session_not_found``, 409
    ``base_mismatch``, 422 on the ``leyline`` extension — becomes a ``SpliceFallbackError`` with
    the server's code, and the next request starts over in a new session (the refused one is
    deleted then); anything else is raised as openai raised it.
    """
    param = exc.param or ""
    if exc.code == "session_not_found" and session.session_id is not None:
        session.session_id = None
    elif exc.status_code in (409, 422) and param.startswith("leyline") and exc.code and session.session_id:
        session._abandoned.append(session.session_id)
        session.session_id = None
    else:
        return exc
    session._forget_base()
    return SpliceFallbackError(str(exc.code), str(exc))


async def delete(routes: LeylineRoutes, session_id: str, quiet: bool = False) -> None:
    """Delete a server-side session; a 404 is fine (``quiet``: any openai error is)."""
    try:
        await routes.delete(f"/leyline/sessions/{session_id}")
    except openai.NotFoundError:
        pass
    except openai.APIError:
        if not quiet:
            raise
