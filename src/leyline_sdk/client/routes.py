"""The session layer's port (:class:`~leyline_sdk.session.port.LeylineRoutes`) over openai-python.

Leyline's routes are sent with the client's own ``post`` / ``get`` / ``delete``
(``cast_to=object``: the decoded JSON), so they share openai's transport, retries, headers and
errors (``openai.APIStatusError`` and its subclasses, ``openai.APIConnectionError``).

The session core is written once, as coroutines over the port. :class:`AsyncRoutes` awaits an
``openai.AsyncOpenAI``; :class:`SyncRoutes` calls an ``openai.OpenAI`` inside ``async def``
methods that never suspend, so :func:`drive` runs such a coroutine to completion in one step,
without an event loop (the blocking client's path).
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import openai

from leyline_sdk.client.fallback import SpliceFallbackError

__all__ = ["AsyncRoutes", "SyncRoutes", "drive"]

T = TypeVar("T")


class _OpenAIErrors:
    """The transport's error classes, as the port names them (openai-python's)."""

    not_found: type[Exception] = openai.NotFoundError
    failure: type[Exception] = openai.APIError

    def fallback_error(self, code: str, message: str, completion: Any = None) -> Exception:
        """A strict session's :class:`SpliceFallbackError`."""
        return SpliceFallbackError(code, message, completion)


class AsyncRoutes(_OpenAIErrors):
    """The port over an ``openai.AsyncOpenAI`` (its retries, headers and errors)."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """``await client.post(path, body=body, cast_to=object)``."""
        return await self.client.post(path, body=dict(body), cast_to=object)

    async def get(self, path: str) -> Any:
        """``await client.get(path, cast_to=object)``."""
        return await self.client.get(path, cast_to=object)

    async def delete(self, path: str) -> Any:
        """``await client.delete(path, cast_to=object)``."""
        return await self.client.delete(path, cast_to=object)


class SyncRoutes(_OpenAIErrors):
    """The port over an ``openai.OpenAI``: blocking calls that never suspend."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client = client

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """``client.post(path, body=body, cast_to=object)``."""
        return self.client.post(path, body=dict(body), cast_to=object)

    async def get(self, path: str) -> Any:
        """``client.get(path, cast_to=object)``."""
        return self.client.get(path, cast_to=object)

    async def delete(self, path: str) -> Any:
        """``client.delete(path, cast_to=object)``."""
        return self.client.delete(path, cast_to=object)


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its I/O is :class:`SyncRoutes`) and return its result.

    Raises ``RuntimeError`` if it does suspend (something awaited real asynchronous I/O).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a blocking Leyline call awaited asynchronous I/O")
