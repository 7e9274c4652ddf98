"""The clients' ``post``: where a ``create``'s request gets its post-parser, and where a chat request
made outside ``create`` (LiteLLM posts its own bodies) goes through a session.

openai's ``create`` builds the request and calls the client's ``post``; the only way to give that
one request a post-parser is there. :func:`in_call` marks the ``create`` in progress (a context
variable, so concurrent calls never mix) and :func:`route_post` reads it:

* inside a ``create`` with a session: the call's post-parser is added to the request's options;
* inside a ``create`` that manages its own ``leyline`` field: openai's ``post``, untouched;
* outside any ``create``, a ``POST /chat/completions`` with messages: prepared through a session
  here (:func:`~leyline_sdk.client.calls.prepare_post`), with its post-parser;
* a ``POST /responses`` (openai's ``responses.create`` and ``responses.stream`` post their own
  bodies): prepared through a session (:func:`~leyline_sdk.client.responses.prepare_responses_post`);
* anything else: openai's ``post``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

import openai

from leyline_sdk.client.answers import Call
from leyline_sdk.client.calls import SessionSource, prepare_post, with_post_parser
from leyline_sdk.client.responses import RESPONSES_PATH, prepare_responses_post
from leyline_sdk.client.routes import drive

__all__ = ["CHAT_PATH", "in_call", "route_post", "route_post_sync", "raise_refused"]

CHAT_PATH = "/chat/completions"
_OWN = object()  # a create that sends its own leyline field: no session
_CURRENT: ContextVar[Any] = ContextVar("leyline_call", default=None)


@contextmanager
def in_call(call: Call | None) -> Iterator[None]:
    """Mark a ``create`` in progress: its session's ``call``, or ``None`` (it manages its own extension)."""
    token = _CURRENT.set(call if call is not None else _OWN)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _hooked(path: str, kwargs: dict[str, Any]) -> bool:
    """Add the current ``create``'s post-parser to a ``post``'s options; whether it was a ``create``'s."""
    current = _CURRENT.get()
    if isinstance(current, Call) and path == CHAT_PATH:
        kwargs["options"] = with_post_parser(kwargs.get("options") or {}, current.post_parser)
    return current is not None


def _direct(path: str, kwargs: dict[str, Any]) -> bool:
    body = kwargs.get("body")
    if path == RESPONSES_PATH:
        return isinstance(body, Mapping)
    return path == CHAT_PATH and isinstance(body, Mapping) and "messages" in body


def _prepare(client: SessionSource, path: str, kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
    prepare = prepare_responses_post if path == RESPONSES_PATH else prepare_post
    return prepare(client, kwargs["body"], kwargs.get("options") or {})


async def route_post(client: Any, super_post: Callable[..., Awaitable[Any]], path: str, kwargs: dict[str, Any]) -> Any:
    """The async client's ``post`` (see the module docstring)."""
    if _hooked(path, kwargs) or not _direct(path, kwargs):
        return await super_post(path, **kwargs)
    prepared = await _prepare(client, path, kwargs)
    if prepared is None:
        return await super_post(path, **kwargs)
    call, kwargs["body"], options = prepared
    kwargs["options"] = with_post_parser(options, call.post_parser)
    try:
        return await super_post(path, **kwargs)
    except openai.APIStatusError as exc:
        raise_refused(call, exc)


def route_post_sync(client: Any, super_post: Callable[..., Any], path: str, kwargs: dict[str, Any]) -> Any:
    """The blocking client's ``post`` (see :func:`route_post`)."""
    if _hooked(path, kwargs) or not _direct(path, kwargs):
        return super_post(path, **kwargs)
    prepared: Any = drive(_prepare(client, path, kwargs))
    if prepared is None:
        return super_post(path, **kwargs)
    call, kwargs["body"], options = prepared
    kwargs["options"] = with_post_parser(options, call.post_parser)
    try:
        return super_post(path, **kwargs)
    except openai.APIStatusError as exc:
        raise_refused(call, exc)


def raise_refused(call: Call, exc: openai.APIStatusError) -> NoReturn:
    """Raise ``exc`` itself, or the strict session's fallback error it becomes (from ``exc``)."""
    refused = call.failed(exc)
    if refused is exc:
        raise exc
    raise refused from exc
