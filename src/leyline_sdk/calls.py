"""One ``chat.completions`` call through a Leyline session: openai's arguments in, openai's answer out.

:func:`prepare_call` takes the keyword arguments of ``create`` (or ``parse``) exactly as openai
takes them, finds or makes the session, lets it run its policies and directives, and returns the
arguments to hand to openai's own method: ``messages`` replaced by the effective messages and the
``leyline`` extension merged into ``extra_body`` (nothing is added against a server without
Leyline). Everything else — ``omit``, ``extra_headers``, ``extra_query``, ``timeout``, ``stream``
— passes through untouched. A call whose ``extra_body`` already has a ``leyline`` field manages
the extension itself: it is sent as given, outside any session.

:meth:`Call.post_parser` is installed as openai's post-parser of that request, so the session
records the turn whichever way the response is read: a ``ChatCompletion``, a raw response's
``.parse()``, a streamed response's ``await .parse()``, or the end of an ``AsyncStream`` /
``Stream`` (which stays openai's object: context manager, ``.response``, ``close()``; only its
iterator is wrapped to see the last chunk's ``leyline`` field and usage).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from leyline_sdk.registry import ClientState
from leyline_sdk.session import LeylineSession
from leyline_sdk.stats import _Turn
from leyline_sdk.validation import check_messages, check_model, check_tools

__all__ = ["Call", "SessionSource", "prepare_call", "given", "with_post_parser"]


class SessionSource(Protocol):
    """What a call needs from its client: the shared state and a way to make a session."""

    _leyline_state: ClientState

    def _new_session(self) -> LeylineSession:
        """A new session with the client's defaults."""
        ...


def given(value: Any) -> bool:
    """Whether an argument was given (openai's ``omit`` / ``NOT_GIVEN`` and ``None`` are not)."""
    return value is not None and not isinstance(value, openai.Omit | openai.NotGiven)


def with_post_parser(options: Mapping[str, Any], parser: Callable[[Any], Any]) -> dict[str, Any]:
    """Request ``options`` with ``parser`` run after any post-parser they already have."""
    out = dict(options)
    inner = out.get("post_parser")
    if callable(inner):
        out["post_parser"] = lambda parsed: parser(inner(parsed))
    else:
        out["post_parser"] = parser
    return out


@dataclass
class Call:
    """A prepared call: the session, its turn, and the arguments for openai's method."""

    session: LeylineSession
    turn: _Turn
    kwargs: dict[str, Any]

    def post_parser(self, parsed: Any) -> Any:
        """Record the turn from what openai parsed; return it unchanged (a stream: once it ends)."""
        if isinstance(parsed, ChatCompletion):
            self.session.record(self.turn, getattr(parsed, "leyline", None), parsed.usage, parsed)
        elif isinstance(parsed, openai.AsyncStream):
            parsed._iterator = self._arecord(parsed._iterator)
        elif isinstance(parsed, openai.Stream):
            parsed._iterator = self._record(parsed._iterator)
        return parsed

    async def _arecord(self, chunks: AsyncIterator[ChatCompletionChunk]) -> AsyncIterator[ChatCompletionChunk]:
        leyline, usage = None, None
        async for chunk in chunks:
            leyline = getattr(chunk, "leyline", None) or leyline
            usage = getattr(chunk, "usage", None) or usage
            yield chunk
        self.session.record(self.turn, leyline, usage)

    def _record(self, chunks: Iterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
        leyline, usage = None, None
        for chunk in chunks:
            leyline = getattr(chunk, "leyline", None) or leyline
            usage = getattr(chunk, "usage", None) or usage
            yield chunk
        self.session.record(self.turn, leyline, usage)

    def failed(self, exc: openai.APIStatusError) -> Exception:
        """The exception to raise for an error answer (a strict session's refused splice: a fallback)."""
        return self.session.refused(exc)


async def prepare_call(
    client: SessionSource, kwargs: Mapping[str, Any], session: LeylineSession | None = None
) -> Call | None:
    """The session's version of ``kwargs``; ``None`` when the caller sent its own ``leyline`` field.

    ``session``: an explicit session (``messages`` / ``tools`` left out mean its history / tools);
    otherwise the remembered session whose history the messages extend, or a new one.
    """
    extra_body = kwargs.get("extra_body")
    if isinstance(extra_body, Mapping) and "leyline" in extra_body:
        return None
    if "model" in kwargs:
        check_model(kwargs["model"])
    messages = kwargs.get("messages")
    if session is not None and messages is None:
        messages = session.history
    history = check_messages(messages)
    out = dict(kwargs)
    tools = check_tools(kwargs["tools"]) if given(kwargs.get("tools")) else None
    if session is not None and tools is None and session.tools:
        tools = session.tools
        out["tools"] = tools
    elif session is not None and "tools" in out and out["tools"] is None:
        del out["tools"]  # a session's "no tools given", not a null to send
    state = client._leyline_state
    await state.registry.reap()
    if session is None:
        session = state.registry.find(history) or client._new_session()
    turn = await session.prepare(history, tools)
    out["messages"] = turn.effective
    if turn.extension is not None:
        extension = turn.extension.model_dump(mode="json", exclude_none=True)
        out["extra_body"] = {**(extra_body or {}), "leyline": extension}
    return Call(session, turn, out)
