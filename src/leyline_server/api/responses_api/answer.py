"""A Responses API answer: the ``response`` object, or its event stream, for one prepared turn.

:class:`ResponseAnswer` is the protocol's :class:`~leyline_server.api.answer.Shape`: a stream opens
with ``response.created`` and ``response.in_progress`` as soon as the turn is admitted,
``response.in_progress`` again keeps it alive while the prompt is prefilled (an event, not an SSE
comment: Codex's idle timer counts events, and its SSE parser drops comments), and its final
``response`` (completed or
incomplete) carries the usage and the ``leyline`` report. A response the client asked to store is
kept once it is whole (:mod:`.store`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.responses_items import output_items
from leyline_server.api.errors import APIError
from leyline_server.api.pipeline import OpenTurn, PreparedTurn
from leyline_server.api.responses_api.convert import ChatInput
from leyline_server.api.responses_api.events import Events, ResponseShape, new_message_id, response_usage
from leyline_server.api.responses_api.inputs import as_stored_items
from leyline_server.api.responses_api.schemas import ResponsesRequest
from leyline_server.api.responses_api.store import ResponseStore, StoredResponse, stored_bytes

__all__ = ["ResponseAnswer"]


@dataclass
class ResponseAnswer:
    """One response's answer (see the module docstring); ``owner``: the key that stores it."""

    req: ResponsesRequest
    chat: ChatInput
    shape: ResponseShape
    store: ResponseStore
    owner: str | None
    route: str = "/v1/responses"
    server_error: str = "server_error"
    frames: Events = field(default_factory=Events)

    def opening(self, prepared: PreparedTurn) -> Iterable[str]:
        """``response.created`` and ``response.in_progress``."""
        yield self.frames.frame("response.created", response=self.shape.body("in_progress", []))
        yield self.frames.frame("response.in_progress", response=self.shape.body("in_progress", []))

    def keep_alive(self) -> str:
        """``response.in_progress`` once more (clients that track state treat it as the no-op it is)."""
        return self.frames.frame("response.in_progress", response=self.shape.body("in_progress", []))

    async def events(self, turn: OpenTurn) -> AsyncIterator[str]:
        """The output items' events, then ``response.completed`` or ``response.incomplete``."""
        events, message_id, logprobs, opened = self.frames, new_message_id(), [], False
        async for delta in turn.deltas():
            if delta.logprob is not None and self.chat.request.logprobs:
                logprobs.append(delta.logprob)
            if delta.text:
                if not opened:
                    opened = True
                    for frame in events.message_start(0, message_id):
                        yield frame
                yield events.text_delta(0, message_id, delta.text, [])
        output, incomplete = self._output(turn, logprobs)
        for index, item in enumerate(output):
            if item["type"] != "message":
                for frame in events.whole_item(index, item):
                    yield frame
                continue
            item["id"] = message_id
            if not opened:
                for frame in events.message_start(index, message_id):
                    yield frame
            if turn.rest:
                yield events.text_delta(index, message_id, turn.rest, [])
            for frame in events.message_end(index, item):
                yield frame
        body = await self._finish(turn, output, incomplete)
        yield events.frame(f"response.{body['status']}", response=body)

    def failure(self, exc: APIError) -> Iterable[str]:
        """``response.failed``."""
        error = {"code": exc.code, "message": exc.message}
        yield self.frames.frame("response.failed", response=self.shape.body("failed", [], error=error))

    def ending(self) -> Iterable[str]:
        """Nothing: the final ``response`` event ends the stream."""
        return ()

    async def whole(self, turn: OpenTurn) -> dict[str, Any]:
        """The ``response`` object."""
        logprobs = [d.logprob async for d in turn.deltas() if d.logprob is not None]
        output, incomplete = self._output(turn, logprobs if self.chat.request.logprobs else [])
        return await self._finish(turn, output, incomplete)

    def _output(self, turn: OpenTurn, logprobs: list[Any]) -> tuple[list[dict[str, Any]], str | None]:
        """The output items and the incomplete reason of a decoded turn."""
        assert turn.outcome is not None
        req = self.req
        message = dict(turn.outcome.message)
        if req.max_tool_calls is not None and message.get("tool_calls"):
            message["tool_calls"] = message["tool_calls"][: req.max_tool_calls]
        sealed = "reasoning.encrypted_content" in (req.include or [])
        items = output_items(message, message.get("reasoning_content"), sealed)
        if logprobs:
            for item in items:
                if item["type"] == "message":
                    item["content"][0]["logprobs"] = logprobs
        incomplete = "max_output_tokens" if turn.outcome.finish_reason == "length" else None
        return items, incomplete

    async def _finish(self, turn: OpenTurn, output: list[dict[str, Any]], incomplete: str | None) -> dict[str, Any]:
        """The final ``response`` (its usage and ``leyline`` report), stored if asked."""
        status = "incomplete" if incomplete else "completed"
        leyline = turn.result().model_dump(mode="json")
        body = self.shape.body(status, output, response_usage(turn.usage()), incomplete=incomplete, leyline=leyline)
        if self.req.store is not False:
            stored = self._stored(body, turn)
            stored.size = await asyncio.to_thread(stored_bytes, stored)  # its bytes count against the key's budget
            self.store.put(stored)
        return body

    def _stored(self, body: dict[str, Any], turn: OpenTurn) -> StoredResponse:
        assert turn.outcome is not None
        messages = [m.model_dump(exclude_none=True) for m in self.chat.request.messages]
        history = messages[1:] if self.req.instructions else messages
        tokens = body["usage"]["total_tokens"] if body.get("usage") else 0
        return StoredResponse(self.shape.id, self.owner, body, as_stored_items(self.req.input),
                              [*history, dict(turn.outcome.message)], tokens)  # fmt: skip
