"""A whole (non-streamed) answer is decoded only while its client is still there.

A stream notices a client that has gone (its next write fails; a paused one ends after
``--stream-stall-timeout``), but a whole answer writes nothing until it is done: without a watch,
a request without ``max_tokens`` decodes to the end of the context after its client has closed
the connection, holding its KV reservation all along. :func:`unless_gone` runs the decode beside
a watch on the connection and cancels it when the client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

__all__ = ["ClientGone", "unless_gone", "GONE_STATUS"]

T = TypeVar("T")
GONE_STATUS = 499  # nginx's "client closed request": logged, never read by anyone


class ClientGone(Exception):
    """The client disconnected before its answer was ready (the work was cancelled)."""


async def _gone(request: Request, poll_s: float) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)


async def unless_gone(request: Request, work: Awaitable[T], poll_s: float = 0.25) -> T:
    """``work``'s result; :class:`ClientGone` (``work`` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_gone(request, poll_s))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone
    return task.result()
