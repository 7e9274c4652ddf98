"""``/v1/messages``: Anthropic's Messages API as an adapter onto the one chat turn.

``POST /v1/messages`` (streamed or not; ``?beta=true`` as Claude Code sends it) and
``POST /v1/messages/count_tokens``. The request becomes a chat turn (:mod:`.inputs`, :mod:`.blocks`;
the server's context editing, :mod:`.context_edits`), the pipeline runs it — sessions, directives,
conversation recognition, structured outputs, admission, limits: nothing here is a second copy
— and its result becomes content blocks and events (:mod:`.events`). ``max_tokens`` past the
room left in the context is capped to the room (``x-leyline-max-tokens-capped``). Errors come in
Anthropic's shape (:func:`~leyline_server.api.errors.error_body`). The key may come as
``x-api-key``; ``anthropic-version`` and ``anthropic-beta`` are accepted as they are.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.disconnect import GONE_STATUS, ClientGone, unless_gone
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.messages_api.blocks import answer_blocks, stop_reason
from leyline_server.api.messages_api.events import BlockStream, frame, message_body, message_usage, new_message_id
from leyline_server.api.messages_api.inputs import MessagesInput, prepare_messages
from leyline_server.api.messages_api.schemas import CountTokensRequest, MessagesRequest
from leyline_server.api.pipeline import OpenTurn, names_header
from leyline_server.api.streaming import ClosingStream, stream_failed

__all__ = ["router"]

router = APIRouter()
log = logging.getLogger("leyline.api")
PATH = "/v1/messages"


@router.post("/v1/messages", response_model=None)
async def create_message(
    req: MessagesRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Any:
    """Anthropic's Messages API on the one chat turn (see the module docstring)."""
    prepared = await prepare_messages(req, key, pipeline)
    turn = await pipeline.open(prepared.request, key, client_edits, recognise=True, cap_max_tokens=True)
    headers = turn.headers()
    if prepared.not_offered:
        headers["x-leyline-tools-not-offered"] = names_header(prepared.not_offered)
    message_id = new_message_id()
    if not req.stream:
        try:
            await unless_gone(request, turn.run())
            return JSONResponse(_final(turn, req, prepared, message_id), headers=headers)
        except ClientGone:
            return Response(status_code=GONE_STATUS)
        finally:
            await turn.close()
    stall = pipeline.service.config.stream_stall_timeout_s
    events = _events(turn, req, prepared, message_id, request)
    return ClosingStream(events, turn.close, stall, turn.ended, media_type="text/event-stream", headers=headers)


def _management(prepared: MessagesInput) -> dict[str, Any] | None:
    return {"applied_edits": prepared.applied} if prepared.applied is not None else None


def _final(turn: OpenTurn, req: MessagesRequest, prepared: MessagesInput, message_id: str) -> dict[str, Any]:
    assert turn.outcome is not None
    stop = stop_reason(turn.outcome.finish_reason, turn.decoder.matched)
    usage = message_usage(turn.usage(), prepared.cache_marked)
    return message_body(message_id, req.model, answer_blocks(turn.outcome.message), stop, usage,
                        context_management=_management(prepared),
                        leyline=turn.result().model_dump(mode="json"))  # fmt: skip


async def _events(
    turn: OpenTurn, req: MessagesRequest, prepared: MessagesInput, message_id: str, request: Request
) -> AsyncIterator[str]:
    usage = {**message_usage(turn.usage(), prepared.cache_marked), "output_tokens": 0}
    start = message_body(message_id, req.model, [], (None, None), usage)
    yield frame({"type": "message_start", "message": start})
    yield frame({"type": "ping"})
    blocks = BlockStream()
    try:
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
        final = _final(turn, req, prepared, message_id)
        for block in final["content"]:
            if not (block["type"] == "text" and streamed):
                for event in blocks.whole(block):
                    yield event
        stop = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
        closing: dict[str, Any] = {"type": "message_delta", "delta": stop, "usage": final["usage"]}
        if prepared.applied is not None:
            closing["context_management"] = _management(prepared)
        yield frame(closing)
        yield frame({"type": "message_stop"})
    except APIError as exc:
        stream_failed(request, exc.status)
        yield frame(error_body(exc.status, exc.code, exc.message, exc.param, PATH))
    except Exception as exc:
        log.exception("message %s failed", message_id)
        stream_failed(request, 500)
        yield frame(error_body(500, "server_error", f"generation failed: {exc}", None, PATH))


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, key: Owner, pipeline: Pipeline) -> dict[str, Any]:
    """The prompt's length in tokens (after the server's context edits, when asked)."""
    prepared = await prepare_messages(req, key, pipeline)
    out: dict[str, Any] = {"input_tokens": await pipeline.count_tokens(prepared.request, key)}
    if prepared.original_tokens is not None:
        out["context_management"] = {"original_input_tokens": prepared.original_tokens}
    return out
