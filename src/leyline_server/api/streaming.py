"""A streamed HTTP answer that always cleans up: :class:`ClosingStream` (every protocol's SSE uses it).

A stream answers 200 before its content is known; one that then fails (its error is an event in
the stream) says so with :func:`stream_failed`, and the guard counts the request under the
error's status in ``leyline_requests_total``, not as a 200.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["ClosingStream", "StreamStalled", "StreamEnded", "STREAM_STATUS", "stream_failed"]

log = logging.getLogger("leyline.api")
STREAM_STATUS = "leyline.stream_status"  # the scope-state entry of a stream that failed after its 200


def stream_failed(request: Request, status: int) -> None:
    """Record that ``request``'s stream failed after its 200, with ``status``."""
    request.scope.setdefault("state", {})[STREAM_STATUS] = status


class StreamStalled(Exception):
    """The client stopped reading: a send waited past the stall timeout."""


class StreamEnded(Exception):
    """The stream's ``ends`` event was set (its session was deleted)."""


class ClosingStream(StreamingResponse):
    """A streaming response that always runs ``on_close`` — finished, abandoned or never iterated.

    A client that stops reading pauses the stream (its sends wait; decoding stops ``RUN_AHEAD``
    steps later); past ``stall_timeout_s`` the stream is ended: the connection is closed and
    ``on_close`` commits what was generated, as for a client that went away. ``ends`` (its
    session's deletion) ends it the same way at once, even while a send waits on the client.
    """

    def __init__(
        self,
        content: AsyncIterator[str],
        on_close: Callable[[], Awaitable[Any]],
        stall_timeout_s: float | None = None,
        ends: asyncio.Event | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_close = on_close
        self._stall_timeout_s = stall_timeout_s
        self._ends = ends

    async def _send(self, send: Send, message: Message) -> None:
        """``send(message)``: :class:`StreamStalled` past the stall timeout, :class:`StreamEnded` once ends."""
        if self._ends is None:
            try:
                await asyncio.wait_for(send(message), self._stall_timeout_s)
            except asyncio.TimeoutError as exc:
                raise StreamStalled from exc
            return
        if self._ends.is_set():
            raise StreamEnded
        sending, ended = asyncio.ensure_future(send(message)), asyncio.ensure_future(self._ends.wait())
        try:
            done, _ = await asyncio.wait({sending, ended}, timeout=self._stall_timeout_s, return_when="FIRST_COMPLETED")
        finally:
            ended.cancel()
            if not sending.done():
                sending.cancel()
        if sending in done:
            sending.result()
        elif ended in done:
            raise StreamEnded
        else:
            raise StreamStalled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_end(message: Message) -> None:
            await self._send(send, message)

        try:
            await super().__call__(scope, receive, send_or_end)
        except StreamStalled:
            log.warning("stream ended: the client read nothing for %g s", self._stall_timeout_s)
        except StreamEnded:
            log.info("stream ended: its session was deleted")
        finally:
            # A client that went away cancels this task, and anyio's cancellation is re-raised at
            # every await: shielded, the clean-up runs to its end (the engine commits what was
            # generated before the session is released, so a request that follows sees it).
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._content, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._on_close()
