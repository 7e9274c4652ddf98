"""``/v1/responses``: OpenAI's Responses API as an adapter onto the one chat turn.

``POST /v1/responses`` (streamed or not), ``GET`` / ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``. The request becomes a chat turn (:mod:`.inputs`,
:mod:`.convert`), the pipeline runs it — sessions, directives, conversation recognition,
structured outputs, admission, limits: nothing here is a second copy — and its result becomes
output items and events (:mod:`.events`). Every Responses request continues its conversation's
session when the server recognises it (a Codex turn carries its last reply; a
``previous_response_id`` names one), so the prefix of the next turn is a cache hit; the
client's own edits are spliced only under the opt-in, exact otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.responses_items import output_items
from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.disconnect import GONE_STATUS, ClientGone, unless_gone
from leyline_server.api.errors import APIError
from leyline_server.api.pipeline import OpenTurn, names_header
from leyline_server.api.responses_api.convert import ChatInput
from leyline_server.api.responses_api.events import Events, ResponseShape, new_message_id, response_usage
from leyline_server.api.responses_api.inputs import as_stored_items, prepare_input
from leyline_server.api.responses_api.schemas import ResponsesRequest
from leyline_server.api.responses_api.store import ResponseStore, StoredResponse, stored_bytes
from leyline_server.api.responses_api.truncation import open_fitting
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.streaming import ClosingStream, stream_failed

__all__ = ["router"]

router = APIRouter()
log = logging.getLogger("leyline.api")

_ECHO = ("instructions", "max_output_tokens", "max_tool_calls", "metadata", "previous_response_id", "reasoning",
         "temperature", "text", "top_p", "top_logprobs", "truncation", "user", "safety_identifier",
         "prompt_cache_key")  # fmt: skip


def store_of(request: Request) -> ResponseStore:
    """The app's stored responses."""
    store: ResponseStore = request.app.state.responses
    return store


def _echo(req: ResponsesRequest) -> dict[str, Any]:
    out = {name: getattr(req, name) for name in _ECHO}
    out.update(
        tools=req.tools or [],
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        store=req.store is not False,
        service_tier="default",
        background=False,
    )
    out["text"] = req.text or {"format": {"type": "text"}}
    out["truncation"] = req.truncation or "disabled"
    return out


def _answer(turn: OpenTurn, req: ResponsesRequest, logprobs: list[Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The output items and the incomplete reason of a decoded turn."""
    assert turn.outcome is not None
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


def _stored(shape: ResponseShape, req: ResponsesRequest, chat: ChatCompletionRequest, body: dict[str, Any],
            turn: OpenTurn, owner: str | None) -> StoredResponse:  # fmt: skip
    assert turn.outcome is not None
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    history = messages[1:] if req.instructions else messages
    tokens = body["usage"]["total_tokens"] if body.get("usage") else 0
    return StoredResponse(
        shape.id, owner, body, as_stored_items(req.input), [*history, dict(turn.outcome.message)], tokens
    )


def _headers(turn: OpenTurn, chat: ChatInput, dropped: int) -> dict[str, str]:
    headers = turn.headers()
    if chat.not_offered:
        headers["x-leyline-tools-not-offered"] = names_header(chat.not_offered)
    if dropped:
        headers["x-leyline-truncated-messages"] = str(dropped)
    return headers


@router.post("/v1/responses", response_model=None)
async def create_response(
    req: ResponsesRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Any:
    """OpenAI's Responses API on the one chat turn (see the module docstring)."""
    store = store_of(request)
    chat = await prepare_input(req, key, pipeline, store)
    shape = ResponseShape(req.model, _echo(req))
    try:
        turn, dropped = await open_fitting(pipeline, chat.request, key, client_edits, req.truncation == "auto")
    except APIError as exc:
        if not req.stream or exc.code != FallbackCode.CONTEXT_LENGTH.value:
            raise
        stream_failed(request, exc.status)
        return ClosingStream(_failed(shape, exc), _nothing, media_type="text/event-stream")
    headers = _headers(turn, chat, dropped)
    if not req.stream:
        try:
            answer = await unless_gone(request, _whole(turn, req, chat, shape, store, key))
            return JSONResponse(answer, headers=headers)
        except ClientGone:
            return Response(status_code=GONE_STATUS)
        finally:
            await turn.close()
    events = _events(turn, req, chat, shape, store, key, request)
    stall = pipeline.service.config.stream_stall_timeout_s
    return ClosingStream(events, turn.close, stall, turn.ended, media_type="text/event-stream", headers=headers)


async def _nothing() -> None:
    return None


async def _whole(
    turn: OpenTurn, req: ResponsesRequest, chat: ChatInput, shape: ResponseShape, store: ResponseStore, key: str | None
) -> dict[str, Any]:
    logprobs = [d.logprob async for d in turn.deltas() if d.logprob is not None]
    output, incomplete = _answer(turn, req, logprobs if chat.request.logprobs else [])
    status = "incomplete" if incomplete else "completed"
    leyline = turn.result().model_dump(mode="json")
    body = shape.body(status, output, response_usage(turn.usage()), incomplete=incomplete, leyline=leyline)
    if req.store is not False:
        await _store(store, _stored(shape, req, chat.request, body, turn, key))
    return body


async def _store(store: ResponseStore, stored: StoredResponse) -> None:
    """Keep ``stored``, measured off the event loop (its bytes count against the key's budget)."""
    stored.size = await asyncio.to_thread(stored_bytes, stored)
    store.put(stored)


async def _failed(shape: ResponseShape, exc: APIError) -> AsyncIterator[str]:
    events = Events()
    yield events.frame("response.created", response=shape.body("in_progress", []))
    error = {"code": exc.code, "message": exc.message}
    yield events.frame("response.failed", response=shape.body("failed", [], error=error))


async def _events(
    turn: OpenTurn,
    req: ResponsesRequest,
    chat: ChatInput,
    shape: ResponseShape,
    store: ResponseStore,
    key: str | None,
    request: Request,
) -> AsyncIterator[str]:
    events, message_id, logprobs = Events(), new_message_id(), []
    yield events.frame("response.created", response=shape.body("in_progress", []))
    yield events.frame("response.in_progress", response=shape.body("in_progress", []))
    opened = False
    try:
        async for delta in turn.deltas():
            if delta.logprob is not None and chat.request.logprobs:
                logprobs.append(delta.logprob)
            if delta.text:
                if not opened:
                    opened = True
                    for frame in events.message_start(0, message_id):
                        yield frame
                yield events.text_delta(0, message_id, delta.text, [])
        output, incomplete = _answer(turn, req, logprobs)
        index = 0
        for item in output:
            if item["type"] == "message":
                item["id"] = message_id
                if not opened:
                    for frame in events.message_start(index, message_id):
                        yield frame
                if turn.rest:
                    yield events.text_delta(index, message_id, turn.rest, [])
                for frame in events.message_end(index, item):
                    yield frame
            else:
                for frame in events.whole_item(index, item):
                    yield frame
            index += 1
        status = "incomplete" if incomplete else "completed"
        leyline = turn.result().model_dump(mode="json")
        body = shape.body(status, output, response_usage(turn.usage()), incomplete=incomplete, leyline=leyline)
        if req.store is not False:
            await _store(store, _stored(shape, req, chat.request, body, turn, key))
        yield events.frame(f"response.{status}", response=body)
    except APIError as exc:
        stream_failed(request, exc.status)
        error = {"code": exc.code, "message": exc.message}
        yield events.frame("response.failed", response=shape.body("failed", [], error=error))
    except Exception as exc:
        log.exception("response %s failed", shape.id)
        stream_failed(request, 500)
        error = {"code": "server_error", "message": f"generation failed: {exc}"}
        yield events.frame("response.failed", response=shape.body("failed", [], error=error))


def _found(store: ResponseStore, response_id: str, key: str | None) -> StoredResponse:
    stored = store.get(response_id, key)
    if stored is None:
        raise APIError(404, "not_found", f"No response found with id {response_id!r}.", "response_id")
    return stored


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, key: Owner, request: Request) -> dict[str, Any]:
    """A stored response of the caller's key (404 for any other)."""
    return _found(store_of(request), response_id, key).response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, key: Owner, request: Request) -> dict[str, Any]:
    """Forget a stored response."""
    store = store_of(request)
    _found(store, response_id, key)
    store.delete(response_id, key)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    response_id: str,
    key: Owner,
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    after: str | None = None,
) -> dict[str, Any]:
    """A stored response's input items, paginated as OpenAI's list."""
    items = list(_found(store_of(request), response_id, key).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
