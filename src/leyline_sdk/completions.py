"""``client.chat.completions`` of the Leyline clients: openai's resource, with sessions.

:class:`AsyncLeylineCompletions` *is* openai's ``AsyncCompletions`` (and
:class:`LeylineCompletions` its ``Completions``): ``create`` and ``parse`` prepare the call
through a session (:func:`~leyline_sdk.calls.prepare_call`) and then call openai's own method,
so argument handling, ``with_raw_response``, ``with_streaming_response``, ``stream()``, retries,
errors, ``AsyncStream`` and ``_request_id`` are openai-python's. The session records the turn
through openai's post-parser hook: the resource's ``_post`` adds it to the one request the
call makes (a context variable carries it there, so concurrent calls never mix).

For type checkers ``create`` and ``parse`` keep openai's signatures and overloads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import openai
from openai._compat import cached_property
from openai.resources.chat import AsyncChat, Chat
from openai.resources.chat.completions import AsyncCompletions, Completions

from leyline_sdk.calls import SessionSource, prepare_call, with_post_parser
from leyline_sdk.routes import drive
from leyline_sdk.session import LeylineSession

__all__ = ["AsyncLeylineChat", "AsyncLeylineCompletions", "LeylineChat", "LeylineCompletions"]

_PARSER: ContextVar[Callable[[Any], Any] | None] = ContextVar("leyline_post_parser", default=None)


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of a ``post`` with the current call's post-parser added to its options."""
    parser = _PARSER.get()
    if parser is not None:
        kwargs["options"] = with_post_parser(kwargs.get("options") or {}, parser)
    return kwargs


class AsyncLeylineCompletions(AsyncCompletions):
    """openai's ``AsyncCompletions`` whose ``create`` / ``parse`` go through a Leyline session."""

    def __init__(self, client: openai.AsyncOpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source
        self._post = self._post_with_parser  # type: ignore[method-assign]

    async def _post_with_parser(self, path: str, **kwargs: Any) -> Any:
        return await self._client.post(path, **_options(kwargs))

    async def _call(
        self, send: Callable[..., Awaitable[Any]], session: LeylineSession | None, kwargs: dict[str, Any]
    ) -> Any:
        call = await prepare_call(self._source, kwargs, session)
        if call is None:
            return await send(self, **kwargs)
        token = _PARSER.set(call.post_parser)
        try:
            return await send(self, **call.kwargs)
        except openai.APIStatusError as exc:
            refused = call.failed(exc)
            if refused is exc:
                raise
            raise refused from exc
        finally:
            _PARSER.reset(token)

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
        self._post = self._post_with_parser  # type: ignore[method-assign]

    def _post_with_parser(self, path: str, **kwargs: Any) -> Any:
        return self._client.post(path, **_options(kwargs))

    def _call(self, send: Callable[..., Any], session: LeylineSession | None, kwargs: dict[str, Any]) -> Any:
        call = drive(prepare_call(self._source, kwargs, session))
        if call is None:
            return send(self, **kwargs)
        token = _PARSER.set(call.post_parser)
        try:
            return send(self, **call.kwargs)
        except openai.APIStatusError as exc:
            refused = call.failed(exc)
            if refused is exc:
                raise
            raise refused from exc
        finally:
            _PARSER.reset(token)

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
