"""The answer to a session's request: :class:`Call`, openai's post-parser that records the turn.

:meth:`Call.post_parser` is installed as openai's post-parser of the request
(:mod:`leyline_sdk.client.post`), so the session records the turn whichever way the response is
read: a ``ChatCompletion``, a raw response's ``.parse()``, a streamed response's
``await .parse()``, or the end of an ``AsyncStream`` / ``Stream`` (which stays openai's object:
context manager, ``.response``, ``close()``; only its iterator is wrapped to see the last
chunk's ``leyline`` field, the usage and the reply). An error answer goes through
:meth:`Call.failed` (:func:`refused`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from leyline_sdk.client.fallback import SpliceFallbackError
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.session.record import record_turn
from leyline_sdk.session.session import LeylineSession
from leyline_sdk.session.turn import PreparedTurn

__all__ = ["Call", "StreamedReply", "refused"]


@dataclass
class StreamedReply:
    """What a stream's chunks add up to: the ``leyline`` field, the usage, and the reply message."""

    leyline: Any = None
    usage: Any = None
    content: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)

    def add(self, chunk: ChatCompletionChunk) -> None:
        """Take what ``chunk`` carries."""
        self.leyline = getattr(chunk, "leyline", None) or self.leyline
        self.usage = getattr(chunk, "usage", None) or self.usage
        for choice in chunk.choices or ():
            delta = choice.delta
            if delta.content:
                self.content.append(delta.content)
            for call in delta.tool_calls or ():
                if call.id:
                    self.call_ids.append(call.id)

    def message(self) -> dict[str, Any]:
        """The reply as an assistant message (content and tool-call ids: what identifies it)."""
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.call_ids:
            out["tool_calls"] = [{"id": i} for i in self.call_ids]
        return out


@dataclass
class Call:
    """A prepared call: the session, its turn, and the arguments for openai's method."""

    session: LeylineSession
    turn: PreparedTurn
    kwargs: dict[str, Any]

    def post_parser(self, parsed: Any) -> Any:
        """Record the turn from what openai parsed; return it unchanged (a stream: once it ends)."""
        if isinstance(parsed, ChatCompletion):
            reply = parsed.choices[0].message.model_dump(exclude_none=True) if parsed.choices else None
            record_turn(self.session, self.turn, getattr(parsed, "leyline", None), parsed.usage, parsed, reply)
        elif isinstance(parsed, openai.AsyncStream):
            parsed._iterator = self._arecord(parsed._iterator)
        elif isinstance(parsed, openai.Stream):
            parsed._iterator = self._record(parsed._iterator)
        return parsed

    async def _arecord(self, chunks: AsyncIterator[ChatCompletionChunk]) -> AsyncIterator[ChatCompletionChunk]:
        seen = StreamedReply()
        async for chunk in chunks:
            seen.add(chunk)
            yield chunk
        record_turn(self.session, self.turn, seen.leyline, seen.usage, reply=seen.message())

    def _record(self, chunks: Iterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
        seen = StreamedReply()
        for chunk in chunks:
            seen.add(chunk)
            yield chunk
        record_turn(self.session, self.turn, seen.leyline, seen.usage, reply=seen.message())

    def failed(self, exc: openai.APIStatusError) -> Exception:
        """The exception to raise for an error answer (a strict session's refused splice: a fallback)."""
        return refused(self.session, exc)


def refused(session: LeylineSession, exc: openai.APIStatusError) -> Exception:
    """What to raise for an error answer to ``session``'s request.

    A strict request's splice refused by the server — 404 ``session_not_found``, 409
    ``base_mismatch``, 422 on the ``leyline`` extension — becomes a ``SpliceFallbackError`` with
    the server's code, and the next request starts over in a new session (the refused one is
    deleted then); anything else is raised as openai raised it.
    """
    param, view = exc.param or "", session.server
    if exc.code == FallbackCode.SESSION_NOT_FOUND.value and view.session_id is not None:
        view.lose_session()
    elif exc.status_code in (409, 422) and param.startswith("leyline") and exc.code and view.session_id:
        view.abandon_session()
    else:
        return exc
    return SpliceFallbackError(str(exc.code), str(exc))
