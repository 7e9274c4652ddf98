"""``/v1/messages``: Anthropic's Messages API as an adapter onto the one chat turn.

``POST /v1/messages`` (streamed or not; ``?beta=true`` as Claude Code sends it) and
``POST /v1/messages/count_tokens``. The request becomes a chat turn (:mod:`.inputs`, :mod:`.blocks`;
the server's context editing, :mod:`.context_edits`), the pipeline runs it — sessions, directives,
conversation recognition, structured outputs, admission, limits: nothing here is a second copy
— and its result becomes content blocks and events (:mod:`.events`). ``max_tokens`` past the
room left in the context is capped to the room (``x-leyline-max-tokens-capped``). A stream's
``message_start`` goes out at admission and ``ping`` events keep it alive while the prompt is
prefilled (:mod:`leyline_server.api.answer`); its ``message_delta`` carries the final usage and the
``leyline`` report, which a whole answer also carries as headers. Errors come in
Anthropic's shape (:func:`~leyline_server.api.errors.error_body`). The key may come as
``x-api-key``; ``anthropic-version`` and ``anthropic-beta`` are accepted as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from leyline_server.api.answer import respond
from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.messages_api.blocks import answer_blocks, stop_reason
from leyline_server.api.messages_api.events import BlockStream, frame, message_body, message_usage, new_message_id
from leyline_server.api.messages_api.inputs import MessagesInput, prepare_messages
from leyline_server.api.messages_api.schemas import CountTokensRequest, MessagesRequest
from leyline_server.api.pipeline import OpenTurn, PreparedTurn
from leyline_server.api.turn_report import names_header

__all__ = ["router"]

router = APIRouter()
PATH = "/v1/messages"


@router.post("/v1/messages", response_model=None)
async def create_message(
    req: MessagesRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Response:
    """Anthropic's Messages API on the one chat turn (see the module docstring)."""
    prepared = await prepare_messages(req, key, pipeline)
    turn = await pipeline.prepare(prepared.request, key, client_edits, recognise=True, cap_max_tokens=True)
    headers = {"x-leyline-tools-not-offered": names_header(prepared.not_offered)} if prepared.not_offered else {}
    if prepared.volatile:
        headers["x-leyline-volatile-lines-dropped"] = str(prepared.volatile)
    return await respond(request, turn, MessageAnswer(req, prepared, new_message_id()), bool(req.stream), headers)


@dataclass
class MessageAnswer:
    """A Messages answer (:class:`~leyline_server.api.answer.Shape`): the message, or its events."""

    req: MessagesRequest
    prepared: MessagesInput
    message_id: str
    route: str = PATH
    server_error: str = "server_error"

    def opening(self, turn: PreparedTurn) -> Iterable[str]:
        """``message_start`` (its usage: the prompt's length; the cache split comes with
        ``message_delta``) and a ``ping``."""
        usage = {"input_tokens": turn.prompt_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                 "output_tokens": 0}  # fmt: skip
        yield frame({"type": "message_start", "message": message_body(self.message_id, self.req.model, [],
                                                                        (None, None), usage)})  # fmt: skip
        yield self.keep_alive()

    def keep_alive(self) -> str:
        """Anthropic's ``ping``."""
        return frame({"type": "ping"})

    async def events(self, turn: OpenTurn) -> AsyncIterator[str]:
        """The content blocks, then ``message_delta`` (the usage, ``leyline``) and ``message_stop``."""
        blocks = BlockStream()
        async for delta in turn.deltas():
            if delta.text:
                if not blocks.open:
                    yield blocks.start({"type": "text", "text": ""})
                yield blocks.delta({"type": "text_delta", "text": delta.text})
        if turn.rest:
            if not blocks.open:
                yield blocks.start({"type": "text", "text": ""})
            yield blocks.delta({"type": "text_delta", "text": turn.rest})
        streamed = blocks.open
        if blocks.open:
            yield blocks.stop()
        final = self._final(turn)
        for block in final["content"]:
            if not (block["type"] == "text" and streamed):
                for event in blocks.whole(block):
                    yield event
        stop = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
        closing: dict[str, Any] = {"type": "message_delta", "delta": stop, "usage": final["usage"]}
        if self.prepared.applied is not None:
            closing["context_management"] = _management(self.prepared)
        closing["leyline"] = final["leyline"]
        yield frame(closing)
        yield frame({"type": "message_stop"})

    def failure(self, exc: APIError) -> Iterable[str]:
        """Anthropic's ``error`` event."""
        yield frame(error_body(exc.status, exc.code, exc.message, exc.param, PATH))

    def ending(self) -> Iterable[str]:
        """Nothing: ``message_stop`` (or the error) ends the stream."""
        return ()

    async def whole(self, turn: OpenTurn) -> dict[str, Any]:
        """The message."""
        await turn.run()
        return self._final(turn)

    def _final(self, turn: OpenTurn) -> dict[str, Any]:
        return _final(turn, self.req, self.prepared, self.message_id)


def _final(turn: OpenTurn, req: MessagesRequest, prepared: MessagesInput, message_id: str) -> dict[str, Any]:
    """The whole message of a decoded turn (a whole answer's body; a stream's last events)."""
    assert turn.outcome is not None
    stop = stop_reason(turn.outcome.finish_reason, turn.decoder.matched)
    usage = message_usage(turn.usage(), prepared.cache_marked)
    return message_body(message_id, req.model, answer_blocks(turn.outcome.message), stop, usage,
                        context_management=_management(prepared),
                        leyline=turn.result().model_dump(mode="json"))  # fmt: skip


def _management(prepared: MessagesInput) -> dict[str, Any] | None:
    return {"applied_edits": prepared.applied} if prepared.applied is not None else None


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, key: Owner, pipeline: Pipeline) -> dict[str, Any]:
    """The prompt's length in tokens (after the server's context edits, when asked)."""
    prepared = await prepare_messages(req, key, pipeline)
    out: dict[str, Any] = {"input_tokens": await pipeline.count_tokens(prepared.request, key)}
    if prepared.original_tokens is not None:
        out["context_management"] = {"original_input_tokens": prepared.original_tokens}
    return out
