"""AsyncLeyline: a drop-in for ``openai.AsyncOpenAI``'s chat completions, with Leyline sessions.

::

    client = AsyncLeyline(base_url="http://localhost:8000/v1", api_key="...", policies=[TruncateOlderThanN(2)])
    response = await client.chat.completions.create(model="m", messages=messages, tools=tools)
    response.leyline            # session id, reused / rotated / prefilled tokens, fallback

Sessions are explicit (``client.session(...)``) or found by the longest known message prefix:
a request whose messages extend a session's full history continues that session. Against a
server without Leyline (no ``/v1/leyline/tokenize``) the client still works: policies shorten the
context, and no extension is sent. ``Leyline`` is the blocking facade for synchronous code.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import httpx
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from leyline_sdk.errors import NotFoundError
from leyline_sdk.rendering import ChatTokenizer, RenderedConversation, Span
from leyline_sdk.session import LeylineSession
from leyline_sdk.transport import Transport

__all__ = ["AsyncLeyline", "Leyline"]


class _Completions:
    def __init__(self, client: AsyncLeyline) -> None:
        self._client = client

    @overload
    async def create(
        self, *, model: str, messages: Sequence[Mapping[str, Any]], stream: Literal[False] = False, **kwargs: Any
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self, *, model: str, messages: Sequence[Mapping[str, Any]], stream: Literal[True], **kwargs: Any
    ) -> AsyncIterator[ChatCompletionChunk]: ...

    async def create(
        self, *, model: str, messages: Sequence[Mapping[str, Any]], stream: bool = False, **kwargs: Any
    ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """Like ``openai``'s: same arguments, same return types; the session is found or made."""
        session = self._client.find_session(messages) or self._client.session()
        return await session.create(model=model, messages=messages, stream=stream, **kwargs)


class _Chat:
    def __init__(self, client: AsyncLeyline) -> None:
        self.completions = _Completions(client)


class AsyncLeyline:
    """Async client; see the module docstring."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        policies: Sequence[Any] = (),
        tokenizer: ChatTokenizer | None = None,
        strict: bool = False,
        max_retries: int = 2,
        timeout: float = 600.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.transport = Transport(base_url, api_key, timeout=timeout, max_retries=max_retries, http_client=http_client)
        self.policies = list(policies)
        self.tokenizer = tokenizer
        self.strict = strict
        self.chat = _Chat(self)
        self.sessions: list[LeylineSession] = []
        self._leyline: bool | None = None

    def session(
        self,
        policies: Sequence[Any] | None = None,
        strict: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> LeylineSession:
        """A new explicit session (defaults: the client's policies and strictness)."""
        session = LeylineSession(
            self, self.policies if policies is None else policies, self.strict if strict is None else strict, tools
        )
        self.sessions.append(session)
        return session

    def find_session(self, messages: Sequence[Mapping[str, Any]]) -> LeylineSession | None:
        """The session whose full history is the longest prefix of ``messages``."""
        best = max(self.sessions, key=lambda s: s.matches(messages), default=None)
        return best if best is not None and best.matches(messages) > 0 else None

    async def leyline_available(self) -> bool:
        """Whether the server speaks Leyline (probed once through ``/leyline/tokenize``)."""
        if self._leyline is None:
            try:
                await self.transport.request(
                    "POST", "/leyline/tokenize", {"messages": [{"role": "user", "content": ""}]}
                )
                self._leyline = True
            except NotFoundError:
                self._leyline = False
        return self._leyline

    async def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, generation: bool = True
    ) -> RenderedConversation:
        """Tokens and spans of ``messages``: the local tokenizer if given, else the server's view."""
        if self.tokenizer is not None:
            return self.tokenizer.render(messages, tools=tools, add_generation_prompt=generation)
        body = {
            "messages": list(messages),
            "tools": list(tools) if tools else None,
            "add_generation_prompt": generation,
        }
        r = await self.transport.request("POST", "/leyline/tokenize", body)
        return RenderedConversation(
            tokens=r["tokens"],
            message_spans=[Span(**s) for s in r["message_spans"]],
            prefix_stable=r["prefix_stable"],
            unstable_reason=r.get("unstable_reason"),
        )

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncLeyline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _SyncCompletions:
    def __init__(self, owner: Leyline) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Blocking ``create``; with ``stream=True`` a blocking iterator of chunks."""
        result = self._owner._run(self._owner.async_client.chat.completions.create(**kwargs))
        if isinstance(result, ChatCompletion):
            return result
        return self._owner._iterate(result)


class Leyline:
    """Blocking facade over :class:`AsyncLeyline` (its own event loop on a background thread)."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="leyline-sdk")
        self._thread.start()
        self.async_client: AsyncLeyline = self._run(self._make(kwargs))
        self.chat = type("Chat", (), {})()
        self.chat.completions = _SyncCompletions(self)

    @staticmethod
    async def _make(kwargs: dict[str, Any]) -> AsyncLeyline:
        return AsyncLeyline(**kwargs)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, stream: AsyncIterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
        while True:
            try:
                yield self._run(stream.__anext__())
            except StopAsyncIteration:
                return

    def session(self, **kwargs: Any) -> LeylineSession:
        """An explicit session (use its async methods through ``run``)."""
        return self.async_client.session(**kwargs)

    def run(self, coro: Any) -> Any:
        """Run a coroutine of the async client (e.g. ``session.apply_edits()``) and wait for it."""
        return self._run(coro)

    def close(self) -> None:
        """Close the client and stop its thread."""
        self._run(self.async_client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
