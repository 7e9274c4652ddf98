"""One answer scaffolding for every protocol: a whole JSON body, or a stream that answers at once.

A route prepares its turn (:meth:`~leyline_server.api.pipeline.ChatPipeline.prepare`: every
HTTP error is raised there) and hands it to :func:`respond` with its protocol's :class:`Shape`.
What happens next is the same for chat completions, Responses and Messages:

* **whole** — the prefill, the decoding and the body run under a watch on the connection
  (:func:`~leyline_server.api.disconnect.unless_gone`): a client that leaves, during its prefill
  or after, cancels the work (499, logged); the headers carry the turn's whole report.
* **stream** — the response starts at once with the protocol's opening events; while the prefill
  runs, a keep-alive goes out every ``--stream-keepalive`` seconds (the protocol's :meth:`Shape.keep_alive`:
  an SSE comment, ``response.in_progress``, Anthropic's ``ping``) so that no client's read or idle
  timeout fires on a long prompt, and the connection is watched:
  a client that leaves stops the prefill at its next chunk. Then the protocol's events. The
  headers carry what is known when the stream starts (:meth:`PreparedTurn.headers` and the
  route's own); the token counts come in the stream's final event. An error after the start is
  the protocol's error event (:func:`~leyline_server.api.streaming.stream_failed` counts it).

However the answer ends, :meth:`PreparedTurn.close` releases what the turn holds (the admission
slot, the KV reservation, the session), and a client that left during its prefill is logged at
INFO with how far the prefill had come.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from leyline_server.api.disconnect import GONE_STATUS, ClientGone, unless_gone
from leyline_server.api.errors import APIError
from leyline_server.api.pipeline import OpenTurn, PreparedTurn
from leyline_server.api.streaming import ClosingStream, stream_failed

__all__ = ["Shape", "respond", "KEEP_ALIVE_COMMENT", "POLL_S"]

log = logging.getLogger("leyline.api")
KEEP_ALIVE_COMMENT = ": keep-alive\n\n"  # an SSE comment: every SSE parser skips it (openai's included)
POLL_S = 0.25  # how often a prefilling stream looks for its client


class Shape(Protocol):
    """One protocol's answer to one request: its events and its whole body."""

    route: str  # for the log
    server_error: str  # the protocol's error code of an unexpected failure

    def opening(self, prepared: PreparedTurn) -> Iterable[str]:
        """The events sent as soon as the stream starts (before the prefill)."""
        ...

    def keep_alive(self) -> str:
        """One keep-alive event, sent while the prefill runs."""
        ...

    def events(self, turn: OpenTurn) -> AsyncIterator[str]:
        """The rest of the stream once the turn is prefilled, up to its final event."""
        ...

    def failure(self, exc: APIError) -> Iterable[str]:
        """The events that report ``exc`` in a stream already started."""
        ...

    def ending(self) -> Iterable[str]:
        """What ends every stream, failed or not (chat's ``[DONE]``)."""
        ...

    async def whole(self, turn: OpenTurn) -> dict[str, Any]:
        """Decode ``turn`` to its end; the whole answer's body."""
        ...


async def respond(
    request: Request, prepared: PreparedTurn, shape: Shape, stream: bool, headers: dict[str, str] | None = None
) -> Response:
    """Answer ``prepared`` as ``shape`` says, whole or streamed (see the module docstring);
    ``headers``: the route's own (tools not offered, messages truncated), added to the turn's."""
    extra = headers or {}
    if not stream:
        return await _whole(request, prepared, shape, extra)
    config = prepared.service.config

    async def close() -> None:
        if prepared.abandoned:
            _log_gone(shape.route, prepared)
        await prepared.close()

    events = _events(request, prepared, shape, config.stream_keepalive_s)
    return ClosingStream(events, close, config.stream_stall_timeout_s, prepared.ended,
                         media_type="text/event-stream", headers={**prepared.headers(), **extra})  # fmt: skip


async def _whole(request: Request, prepared: PreparedTurn, shape: Shape, extra: dict[str, str]) -> Response:
    """Prefill, decode and build the body under a watch on the client; 499 if it leaves first."""

    async def work() -> Response:
        turn = await prepared.prefill()
        body = await shape.whole(turn)
        return JSONResponse(body, headers={**turn.headers(), **extra})

    try:
        return await unless_gone(request, work())
    except ClientGone:
        _log_gone(shape.route, prepared)
        return Response(status_code=GONE_STATUS)
    finally:
        await prepared.close()


async def _events(request: Request, prepared: PreparedTurn, shape: Shape, keep_alive_s: float) -> AsyncIterator[str]:
    """The stream: opening events, keep-alives while the prefill runs, then the protocol's events."""
    try:
        for event in shape.opening(prepared):
            yield event
        task = prepared.prefill()
        loop = asyncio.get_running_loop()
        due = loop.time() + keep_alive_s
        while not task.done():
            await asyncio.wait({task}, timeout=min(POLL_S, max(due - loop.time(), 0.0)))
            if task.done():
                break
            if await request.is_disconnected():
                return  # the stream's close cancels the prefill and logs it
            if loop.time() >= due:
                due = loop.time() + keep_alive_s
                yield shape.keep_alive()
        async for event in shape.events(task.result()):
            yield event
    except APIError as exc:  # the response has started: report in the stream, then end it
        stream_failed(request, exc.status)
        for event in shape.failure(exc):
            yield event
    except Exception as exc:
        log.exception("%s: the stream failed", shape.route)
        stream_failed(request, 500)
        for event in shape.failure(APIError(500, shape.server_error, f"generation failed: {exc}")):
            yield event
    for event in shape.ending():
        yield event


def _log_gone(route: str, prepared: PreparedTurn) -> None:
    """Say that ``prepared``'s client left, and how far its prefill had come if it left during it."""
    who = f"key sha256:{hashlib.sha256(prepared.owner.encode()).hexdigest()[:8]}" if prepared.owner else "no key"
    if not prepared.abandoned:
        log.info("%s (%s): the client left while its answer was decoded; decoding stopped", route, who)
        return
    p = prepared.progress
    log.info(
        "%s (%s): the client left during its prefill; stopped at %d of %d prompt tokens (%d of them cached), "
        "its KV reservation and admission slot released",
        route, who, p.done, p.total, p.reused,
    )  # fmt: skip
