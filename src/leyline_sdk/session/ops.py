"""A session's requests other than a turn: splice now, settle before a turn, resynchronise, delete.

Each works on the session's :class:`~leyline_sdk.session.server_view.ServerView` through its
methods and on the session's routes:

* :func:`splice_now` — ``session.sync_edits()``: the policies' edits sent as directives without
  generating (``POST /leyline/sessions/{id}/directives``), e.g. while a tool runs;
* :func:`settle` — before a turn: delete the server sessions a strict refusal abandoned, and
  resynchronise after a turn whose answer was never read;
* :func:`resync` — after such a turn, the server's base (``GET /leyline/sessions/{id}``) tells
  whether it moved;
* :func:`delete` — ``DELETE /leyline/sessions/{id}``, a 404 being fine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from leyline_sdk.core.directives import Directive
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.validation import check_tools
from leyline_sdk.core.wire import DirectivesResult, SessionInfo
from leyline_sdk.session.blocks import with_repair
from leyline_sdk.session.gateway import Gateway
from leyline_sdk.session.history import History
from leyline_sdk.session.planner import Unplanned, sync_plan
from leyline_sdk.session.port import LeylineRoutes
from leyline_sdk.session.renderer import Renderer
from leyline_sdk.session.server_view import ServerView
from leyline_sdk.session.stats import TurnStats
from leyline_sdk.session.turn import PreparedTurn

__all__ = ["SessionParts", "splice_now", "settle", "resync", "delete"]


class SessionParts(Protocol):
    """What these requests use of a :class:`~leyline_sdk.session.session.LeylineSession`: its public state."""

    server: ServerView
    conversation: History
    routes: LeylineRoutes
    renderer: Renderer
    policies: list[Any]
    tools: list[dict[str, Any]] | None
    strict: bool
    seam_repair: int
    stats: list[TurnStats]
    last_directives: list[Directive]

    @property
    def gateway(self) -> Gateway | None:
        """The gateway the session's requests pass, if any."""
        ...

    def touch(self) -> None:
        """Tell the client's registry the session was used."""
        ...

    def fallback(self, turn: PreparedTurn | None, code: FallbackCode, message: str) -> None:
        """Record (or, strict, raise) a fallback."""
        ...


async def splice_now(session: SessionParts, tools: Sequence[Mapping[str, Any]] | None) -> TurnStats | None:
    """``session.sync_edits(tools)``: see there (behind a gateway: left to the next turn)."""
    view = session.server
    if view.session_id is None or session.gateway is not None:
        return None
    started = time.perf_counter()
    session.touch()
    tools = check_tools(tools) if tools is not None else session.tools
    passed = session.conversation.apply_policies(session.policies, tools)
    prompt = await session.renderer.render(passed.effective, tools)
    if prompt is None:
        return None
    try:
        plan = sync_plan(view, passed.effective, prompt, passed.modes)
    except Unplanned as why:
        session.fallback(None, why.code, why.message)
        return None
    if plan is None or not plan.directives:
        return None
    directives = with_repair(plan.directives, session.seam_repair)
    stats = TurnStats(
        turn=len(session.stats) + 1,
        directives=len(directives),
        cleared=len(passed.report.cleared),
        removed_chars=passed.report.removed_chars,
    )
    seen = passed.effective[: len(view.seen)]
    await _send_directives(session, directives, seen, plan.seen, stats)
    stats.elapsed_ms = (time.perf_counter() - started) * 1e3
    session.stats.append(stats)
    return stats


async def _send_directives(
    session: SessionParts,
    directives: list[Directive],
    seen: list[dict[str, Any]],
    render: Any,
    stats: TurnStats,
) -> None:
    view, routes = session.server, session.routes
    assert view.base_tokens is not None and view.session_id is not None
    body = {
        "base": view.base_ref().model_dump(),
        "directives": [d.model_dump(mode="json") for d in directives],
        "strict": session.strict,
    }
    try:
        raw = await routes.post(f"/leyline/sessions/{view.session_id}/directives", body)
    except routes.not_found as exc:
        view.lose_session()
        stats.fallback = FallbackCode.SESSION_NOT_FOUND.value
        if session.strict:
            raise routes.fallback_error(FallbackCode.SESSION_NOT_FOUND.value, str(exc)) from exc
        return
    result = DirectivesResult.model_validate(raw)
    stats.count(result)
    stats.fallback = result.fallback.code if result.fallback else None
    session.last_directives = directives
    view.spliced(directives, result.base.digest or "", seen, render)


async def settle(session: SessionParts) -> None:
    """Before a turn: delete abandoned server sessions, and resynchronise after an unread turn."""
    view = session.server
    while view.abandoned and session.gateway is None:
        await delete(session.routes, view.abandoned.pop(), quiet=True)
    if view.unrecorded is None:
        return
    sent, view.unrecorded = view.unrecorded, None
    if session.gateway is None:
        await resync(session.routes, view, sent)
    else:  # the session route is out of reach: the next request sends no directives
        view.forget_base()


async def resync(routes: LeylineRoutes, view: ServerView, sent: PreparedTurn) -> None:
    """After ``sent`` went unrecorded: adopt the server's base if it is ``sent``'s prompt plus
    generated tokens, keep ours if it did not move, else forget it (the next request then sends
    no directives). A session the server no longer has starts over."""
    if view.session_id is None or sent.prompt is None:
        return
    try:
        info = SessionInfo.model_validate(await routes.get(f"/leyline/sessions/{view.session_id}"))
    except routes.not_found:
        view.lose_session()
        return
    tokens = info.tokens or []
    moved = view.moved_to(tokens, info.base.digest or "", sent.prompt.tokens)
    if moved:
        view.adopt(tokens, info.base.digest or "", list(sent.effective), sent.prompt)
    elif moved is False:
        view.forget_base()


async def delete(routes: LeylineRoutes, session_id: str, quiet: bool = False) -> None:
    """Delete a server-side session; a 404 is fine (``quiet``: any transport error is)."""
    try:
        await routes.delete(f"/leyline/sessions/{session_id}")
    except routes.not_found:
        pass
    except routes.failure:
        if not quiet:
            raise
