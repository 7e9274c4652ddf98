"""``client.chat.completions`` of the Leyline clients: openai's resource, with sessions.

:class:`AsyncLeylineCompletions` *is* openai's ``AsyncCompletions`` (and
:class:`LeylineCompletions` its ``Completions``): ``create`` and ``parse`` prepare the call
through a session (:func:`~leyline_sdk.client.calls.prepare_call`) and then call openai's own method,
so argument handling, ``with_raw_response``, ``with_streaming_response``, ``stream()``, retries,
errors, ``AsyncStream`` and ``_request_id`` are openai-python's. The session records the turn
through openai's post-parser hook: the client's ``post`` (:func:`route_post` /
:func:`route_post_sync`) adds it to the one request the call makes (context variables carry it
there, so concurrent calls never mix). A ``POST /chat/completions`` made through the client
outside ``create`` — LiteLLM posts its own request bodies — goes through a session there too.

For type checkers ``create`` and ``parse`` keep openai's signatures and overloads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import openai
from openai._compat import cached_property
from openai.resources.chat import AsyncChat, Chat
from openai.resources.chat.completions import AsyncCompletions, Completions

from leyline_sdk.client.calls import Call, SessionSource, prepare_call, prepare_post, with_post_parser
from leyline_sdk.client.routes import drive
from leyline_sdk.session.session import LeylineSession

__all__ = [
    "AsyncLeylineChat",
    "AsyncLeylineCompletions",
    "LeylineChat",
    "LeylineCompletions",
    "route_post",
    "route_post_sync",
]

_PARSER: ContextVar[Callable[[Any], Any] | None] = ContextVar("leyline_post_parser", default=None)
_IN_CALL: ContextVar[bool] = ContextVar("leyline_in_call", default=False)
CHAT_PATH = "/chat/completions"


def _hooked(path: str, kwargs: dict[str, Any]) -> bool:
    """Add the current call's post-parser to a ``post``'s options; whether it was a call's request."""
    parser = _PARSER.get()
    if parser is None or path != CHAT_PATH:
        return _IN_CALL.get()
    kwargs["options"] = with_post_parser(kwargs.get("options") or {}, parser)
    return True


def _direct(path: str, kwargs: dict[str, Any]) -> bool:
    body = kwargs.get("body")
    return path == CHAT_PATH and isinstance(body, Mapping) and "messages" in body


async def route_post(client: Any, super_post: Callable[..., Awaitable[Any]], path: str, kwargs: dict[str, Any]) -> Any:
    """The async client's ``post``: a ``create``'s request gets its post-parser; a chat request made
    outside ``create`` goes through a session; anything else is openai's ``post``."""
    if _hooked(path, kwargs) or not _direct(path, kwargs):
        return await super_post(path, **kwargs)
    prepared = await prepare_post(client, kwargs["body"], kwargs.get("options") or {})
    if prepared is None:
        return await super_post(path, **kwargs)
    call, kwargs["body"], kwargs["options"] = prepared
    kwargs["options"] = with_post_parser(kwargs["options"], call.post_parser)
    try:
        return await super_post(path, **kwargs)
    except openai.APIStatusError as exc:
        raise _refused(call, exc) from exc


def route_post_sync(client: Any, super_post: Callable[..., Any], path: str, kwargs: dict[str, Any]) -> Any:
    """The blocking client's ``post`` (see :func:`route_post`)."""
    if _hooked(path, kwargs) or not _direct(path, kwargs):
        return super_post(path, **kwargs)
    prepared = drive(prepare_post(client, kwargs["body"], kwargs.get("options") or {}))
    if prepared is None:
        return super_post(path, **kwargs)
    call, kwargs["body"], kwargs["options"] = prepared
    kwargs["options"] = with_post_parser(kwargs["options"], call.post_parser)
    try:
        return super_post(path, **kwargs)
    except openai.APIStatusError as exc:
        raise _refused(call, exc) from exc


def _refused(call: Call, exc: openai.APIStatusError) -> Exception:
    """``exc`` itself, or the strict session's fallback error it becomes (raised from ``exc``)."""
    refused = call.failed(exc)
    if refused is exc:
        raise exc
    return refused


class AsyncLeylineCompletions(AsyncCompletions):
    """openai's ``AsyncCompletions`` whose ``create`` / ``parse`` go through a Leyline session."""

    def __init__(self, client: openai.AsyncOpenAI, source: SessionSource) -> None:
        super().__init__(client)
        self._source = source

    async def _call(
        self, send: Callable[..., Awaitable[Any]], session: LeylineSession | None, kwargs: dict[str, Any]
    ) -> Any:
        call = await prepare_call(self._source, kwargs, session)
        in_call = _IN_CALL.set(True)
        if call is None:
            try:
                return await send(self, **kwargs)
            finally:
                _IN_CALL.reset(in_call)
        token = _PARSER.set(call.post_parser)
        try:
            return await send(self, **call.kwargs)
        except openai.APIStatusError as exc:
            raise _refused(call, exc) from exc
        finally:
            _PARSER.reset(token)
            _IN_CALL.reset(in_call)

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
        in_call = _IN_CALL.set(True)
        if call is None:
            try:
                return send(self, **kwargs)
            finally:
                _IN_CALL.reset(in_call)
        token = _PARSER.set(call.post_parser)
        try:
            return send(self, **call.kwargs)
        except openai.APIStatusError as exc:
            raise _refused(call, exc) from exc
        finally:
            _PARSER.reset(token)
            _IN_CALL.reset(in_call)

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
