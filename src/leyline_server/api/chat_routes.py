"""``POST /v1/chat/completions``: OpenAI's chat completions with the ``leyline`` extension, SSE or not.

The route parses and answers; the turn itself is :class:`~leyline_server.api.pipeline.ChatPipeline`'s.
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
from leyline_server.api.pipeline import OpenTurn
from leyline_server.api.responses import Completion, sse
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.streaming import ClosingStream, stream_failed

__all__ = ["router"]

router = APIRouter()
log = logging.getLogger("leyline.api")


async def _complete(turn: OpenTurn, completion: Completion, logprobs: bool) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    async for delta in turn.deltas():
        if delta.logprob is not None:
            entries.append(delta.logprob)
    assert turn.outcome is not None
    leyline = turn.result().model_dump(mode="json")
    return completion.body(
        turn.outcome.message,
        turn.outcome.finish_reason,
        entries if logprobs else None,
        usage=turn.usage(),
        leyline=leyline,
    )


async def _events(turn: OpenTurn, completion: Completion, include_usage: bool, request: Request) -> AsyncIterator[str]:
    try:
        yield completion.chunk({"role": "assistant", "content": ""})
        pending: list[dict[str, Any]] = []
        async for delta in turn.deltas():
            if delta.logprob is not None:
                pending.append(delta.logprob)
            if delta.text:
                yield completion.chunk({"content": delta.text}, logprobs=pending)
                pending = []
        outcome = turn.outcome
        assert outcome is not None
        if turn.rest or pending:
            yield completion.chunk({"content": turn.rest}, logprobs=pending)
        if outcome.calls:
            yield completion.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(outcome.calls)]})
        yield completion.chunk({}, outcome.finish_reason, leyline=turn.result().model_dump(mode="json"))
        if include_usage:
            yield completion.usage_chunk(turn.chat.turn)
    except APIError as exc:  # headers are sent: report in the stream, then end it
        stream_failed(request, exc.status)
        yield sse(error_body(exc.status, exc.code, exc.message, exc.param))
    except Exception as exc:
        log.exception("stream %s failed", completion.id)
        stream_failed(request, 500)
        yield sse(error_body(500, "internal_error", f"generation failed: {exc}"))
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Any:
    """OpenAI's chat completion; ``leyline`` in the body asks for a session and directives."""
    turn = await pipeline.open(body, key, client_edits)
    completion = Completion(body.model, id=body.rid) if body.rid else Completion(body.model)
    headers = turn.headers()
    if not body.stream:
        try:
            answer = await unless_gone(request, _complete(turn, completion, bool(body.logprobs)))
            return JSONResponse(answer, headers=headers)
        except ClientGone:
            return Response(status_code=GONE_STATUS)
        finally:
            await turn.close()
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    events = _events(turn, completion, include_usage, request)
    stall = pipeline.service.config.stream_stall_timeout_s
    return ClosingStream(events, turn.close, stall, turn.ended, media_type="text/event-stream", headers=headers)
