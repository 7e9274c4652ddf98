"""A streamed HTTP answer that always cleans up: :class:`ClosingStream` (every protocol's SSE uses it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["ClosingStream", "StreamStalled"]

log = logging.getLogger("leyline.api")


class StreamStalled(Exception):
    """The client stopped reading: a send waited past the stall timeout."""


class ClosingStream(StreamingResponse):
    """A streaming response that always runs ``on_close`` — finished, abandoned or never iterated.

    A client that stops reading pauses the stream (its sends wait; decoding stops ``RUN_AHEAD``
    steps later); past ``stall_timeout_s`` the stream is ended: the connection is closed and
    ``on_close`` commits what was generated, as for a client that went away.
    """

    def __init__(
        self,
        content: AsyncIterator[str],
        on_close: Callable[[], Awaitable[Any]],
        stall_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_close = on_close
        self._stall_timeout_s = stall_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_stall(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self._stall_timeout_s)
            except asyncio.TimeoutError as exc:
                raise StreamStalled from exc

        try:
            await super().__call__(scope, receive, send_or_stall)
        except StreamStalled:
            log.warning("stream ended: the client read nothing for %g s", self._stall_timeout_s)
        finally:
            # A client that went away cancels this task, and anyio's cancellation is re-raised at
            # every await: shielded, the clean-up runs to its end (the engine commits what was
            # generated before the session is released, so a request that follows sees it).
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._content, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._on_close()
