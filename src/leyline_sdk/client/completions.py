"""``client.chat.completions`` of the Leyline clients: openai's resource, with sessions.

:class:`AsyncLeylineCompletions` *is* openai's ``AsyncCompletions`` (and
:class:`LeylineCompletions` its ``Completions``): ``create`` and ``parse`` prepare the call
through a session (:func:`~leyline_sdk.client.calls.prepare_call`) and then call openai's own method,
so argument handling, ``with_raw_response``, ``with_streaming_response``, ``stream()``, retries,
errors, ``AsyncStream`` and ``_request_id`` are openai-python's. The session records the turn
through openai's post-parser hook, which the client's ``post`` adds to the one request the call
makes (:mod:`leyline_sdk.client.post`).

For type checkers ``create`` and ``parse`` keep openai's signatures and overloads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import openai
from openai.resources.chat import AsyncChat, Chat
from openai.resources.chat.completions import AsyncCompletions, Completions

from leyline_sdk.client.calls import SessionSource, prepare_call
from leyline_sdk.client.post import in_call, raise_refused
from leyline_sdk.client.routes import drive
from leyline_sdk.session.session import LeylineSession

__all__ = ["AsyncLeylineChat", "AsyncLeylineCompletions", "LeylineChat", "LeylineCompletions"]


class AsyncLeylineCompletions(AsyncCompletions):
    """openai's ``AsyncCompletions`` whose ``create`` / ``parse`` go through a Leyline session."""

    def __init__(self, client: openai.AsyncOpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source

    async def _call(
        self, send: Callable[..., Awaitable[Any]], session: LeylineSession | None, kwargs: dict[str, Any]
    ) -> Any:
        call = await prepare_call(self._source, kwargs, session)
        with in_call(call):
            try:
                return await send(self, **(call.kwargs if call is not None else kwargs))
            except openai.APIStatusError as exc:
                if call is None:
                    raise
                raise_refused(call, exc)

    async def _leyline_create(self, **kwargs: Any) -> Any:
        """openai's ``create``, in the session the messages continue (or a new one)."""
        return await self._call(AsyncCompletions.create, None, kwargs)

    async def _leyline_parse(self, **kwargs: Any) -> Any:
        """openai's ``parse`` (structured outputs), in the session the messages continue."""
        return await self._call(AsyncCompletions.parse, None, kwargs)

    async def create_in(self, session: LeylineSession, **kwargs: Any) -> Any:
        """openai's ``create`` in ``session`` (what ``LeylineSession.create`` calls)."""
        return await self._call(AsyncCompletions.create, session, kwargs)

    if not TYPE_CHECKING:  # type checkers see openai's signatures and overloads
        create = _leyline_create
        parse = _leyline_parse


class LeylineCompletions(Completions):
    """openai's ``Completions`` whose ``create`` / ``parse`` go through a Leyline session."""

    def __init__(self, client: openai.OpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source

    def _call(self, send: Callable[..., Any], session: LeylineSession | None, kwargs: dict[str, Any]) -> Any:
        call = drive(prepare_call(self._source, kwargs, session))
        with in_call(call):
            try:
                return send(self, **(call.kwargs if call is not None else kwargs))
            except openai.APIStatusError as exc:
                if call is None:
                    raise
                raise_refused(call, exc)

    def _leyline_create(self, **kwargs: Any) -> Any:
        """openai's ``create``, in the session the messages continue (or a new one)."""
        return self._call(Completions.create, None, kwargs)

    def _leyline_parse(self, **kwargs: Any) -> Any:
        """openai's ``parse`` (structured outputs), in the session the messages continue."""
        return self._call(Completions.parse, None, kwargs)

    def create_in(self, session: LeylineSession, **kwargs: Any) -> Any:
        """openai's ``create`` in ``session`` (what the blocking client's sessions call)."""
        return self._call(Completions.create, session, kwargs)

    if not TYPE_CHECKING:
        create = _leyline_create
        parse = _leyline_parse


class AsyncLeylineChat(AsyncChat):
    """openai's ``AsyncChat`` with :class:`AsyncLeylineCompletions`."""

    def __init__(self, client: openai.AsyncOpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source

    @cached_property
    def completions(self) -> AsyncLeylineCompletions:
        """Chat completions through Leyline sessions."""
        return AsyncLeylineCompletions(self._client, self._source)


class LeylineChat(Chat):
    """openai's ``Chat`` with :class:`LeylineCompletions`."""

    def __init__(self, client: openai.OpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source

    @cached_property
    def completions(self) -> LeylineCompletions:
        """Chat completions through Leyline sessions."""
        return LeylineCompletions(self._client, self._source)
