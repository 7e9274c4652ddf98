"""AsyncLeyline: a drop-in for ``openai.AsyncOpenAI``'s chat completions, with Leyline sessions.

::

    async with AsyncLeyline(base_url="http://localhost:8000/v1", policies=[TruncateOlderThanN(2)]) as client:
        response = await client.chat.completions.create(model="m", messages=messages, tools=tools)
        response.leyline            # session id, reused / rotated / prefilled tokens, fallback

Sessions are cache handles, explicit (``client.session(...)``) or found by the longest known
message prefix: a request whose messages extend a session's full history continues that session.
The client remembers at most ``max_sessions`` of them (least recently used first out; a forgotten
session's server-side session is deleted at the client's next call), and deletes the server-side
sessions of all it remembers on ``aclose()`` / ``async with`` exit. Against a server without
Leyline (no ``/v1/leyline/tokenize``) the client still works: policies shorten the context, and
no extension is sent. ``Leyline`` is the blocking facade for synchronous code.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import httpx
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from leyline_sdk.blocks import Blocks
from leyline_sdk.errors import LeylineError
from leyline_sdk.renderer import LeylineProbe, LocalRenderer, Renderer, ServerRenderer
from leyline_sdk.rendering import ChatTokenizer
from leyline_sdk.session import LeylineSession
from leyline_sdk.transport import Transport
from leyline_sdk.validation import check_messages, check_model, check_tools

__all__ = ["AsyncLeyline", "Leyline"]

T = TypeVar("T")


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
        check_model(model)
        history = check_messages(messages)
        if "tools" in kwargs:
            kwargs["tools"] = check_tools(kwargs["tools"])
        await self._client.reap()
        session = self._client.find_session(history) or self._client.session()
        return await session.create(model=model, messages=history, stream=stream, **kwargs)


class _Chat:
    def __init__(self, client: AsyncLeyline) -> None:
        self.completions = _Completions(client)


class AsyncLeyline:
    """Async client; see the module docstring.

    ``seam_repair=k`` (default 4, chosen by ``benchmarks/bench_notes.py``) asks the server to
    recompute the first ``k`` tokens after every ``amortize`` replacement its sessions send (the
    seam), and a placed block's first ``k``.
    ``client.blocks`` creates, reuses and deletes precompiled KV blocks (``leyline_sdk.blocks``).
    """

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
        max_sessions: int = 256,
        seam_repair: int = 4,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if isinstance(seam_repair, bool) or not isinstance(seam_repair, int) or seam_repair < 0:
            raise ValueError(f"seam_repair must be an int >= 0, got {seam_repair!r}")
        self.transport = Transport(base_url, api_key, timeout=timeout, max_retries=max_retries, http_client=http_client)
        self.probe = LeylineProbe(self.transport)
        self.policies = list(policies)
        self.tokenizer = tokenizer
        self.strict = strict
        self.max_sessions = max_sessions
        self.seam_repair = seam_repair
        self.blocks = Blocks(self.transport)
        self.chat = _Chat(self)
        self._sessions: OrderedDict[int, LeylineSession] = OrderedDict()  # LRU: least recent first
        self._evicted: list[LeylineSession] = []

    @property
    def sessions(self) -> list[LeylineSession]:
        """The sessions the client remembers, least recently used first."""
        return list(self._sessions.values())

    def renderer(self) -> Renderer:
        """A renderer for one new session: the local tokenizer if given, else the server's."""
        if self.tokenizer is not None:
            return LocalRenderer(self.tokenizer, self.probe)
        return ServerRenderer(self.transport, self.probe)

    def session(
        self,
        policies: Sequence[Any] | None = None,
        strict: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        seam_repair: int | None = None,
    ) -> LeylineSession:
        """A new explicit session (defaults: the client's policies, strictness and seam repair)."""
        session = LeylineSession(
            self.transport,
            self.renderer(),
            self.policies if policies is None else policies,
            self.strict if strict is None else strict,
            tools,
            on_use=self._touch,
            seam_repair=self.seam_repair if seam_repair is None else seam_repair,
            blocks=self.blocks,
        )
        self._touch(session)
        return session

    def _touch(self, session: LeylineSession) -> None:
        """Mark ``session`` most recently used; forget the least recent beyond ``max_sessions``."""
        self._sessions[id(session)] = session
        self._sessions.move_to_end(id(session))
        while len(self._sessions) > self.max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._evicted.append(evicted)

    def find_session(self, messages: Sequence[Mapping[str, Any]]) -> LeylineSession | None:
        """The remembered session whose full history is the longest prefix of ``messages``."""
        best, best_n = None, 0
        for session in self._sessions.values():
            n = session.matches(messages)
            if n > best_n:
                best, best_n = session, n
        if best is not None:
            self._touch(best)
        return best

    async def reap(self) -> None:
        """Delete the server-side sessions of sessions the client forgot (best effort)."""
        evicted, self._evicted = self._evicted, []
        for session in evicted:
            if id(session) not in self._sessions:
                await _close_quietly(session)

    async def aclose(self) -> None:
        """Delete every remembered session on the server (404s and errors ignored), then close HTTP.

        The sessions stay in ``sessions`` (their stats and histories remain readable).
        """
        await self.reap()
        for session in self.sessions:
            await _close_quietly(session)
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncLeyline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _close_quietly(session: LeylineSession) -> None:
    """``session.aclose()``; a server that is gone or refuses must not fail a client's close."""
    try:
        await session.aclose()
    except LeylineError:
        pass


class _SyncCompletions:
    def __init__(self, owner: Leyline) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Blocking ``create``; with ``stream=True`` a blocking iterator of chunks."""
        result = self._owner.run(self._owner.async_client.chat.completions.create(**kwargs))
        if isinstance(result, ChatCompletion):
            return result
        return self._owner._iterate(result)


class _SyncChat:
    def __init__(self, owner: Leyline) -> None:
        self.completions = _SyncCompletions(owner)


class Leyline:
    """Blocking facade over :class:`AsyncLeyline` (its own event loop on a background thread)."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="leyline-sdk")
        self._thread.start()
        self.async_client: AsyncLeyline = self.run(self._make(kwargs))
        self.chat = _SyncChat(self)

    @staticmethod
    async def _make(kwargs: dict[str, Any]) -> AsyncLeyline:
        return AsyncLeyline(**kwargs)

    def _iterate(self, stream: AsyncIterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
        async def step() -> ChatCompletionChunk:
            return await stream.__anext__()

        while True:
            try:
                yield self.run(step())
            except StopAsyncIteration:
                return

    def session(self, **kwargs: Any) -> LeylineSession:
        """An explicit session (use its async methods through ``run``)."""
        return self.async_client.session(**kwargs)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the async client (e.g. ``session.sync_edits()``) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Delete the server-side sessions, close the client and stop its thread."""
        self.run(self.async_client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> Leyline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
