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

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.api.answer import respond
from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.errors import APIError
from leyline_server.api.responses_api.answer import ResponseAnswer
from leyline_server.api.responses_api.convert import ChatInput
from leyline_server.api.responses_api.events import Events, ResponseShape
from leyline_server.api.responses_api.inputs import prepare_input
from leyline_server.api.responses_api.schemas import ResponsesRequest
from leyline_server.api.responses_api.store import ResponseStore, StoredResponse
from leyline_server.api.responses_api.truncation import open_fitting
from leyline_server.api.streaming import ClosingStream, stream_failed
from leyline_server.api.turn_report import names_header

__all__ = ["router"]

router = APIRouter()

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


def _headers(chat: ChatInput, dropped: int) -> dict[str, str]:
    headers = {}
    if chat.not_offered:
        headers["x-leyline-tools-not-offered"] = names_header(chat.not_offered)
    if dropped:
        headers["x-leyline-truncated-messages"] = str(dropped)
    return headers


@router.post("/v1/responses", response_model=None)
async def create_response(
    req: ResponsesRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Response:
    """OpenAI's Responses API on the one chat turn (see the module docstring)."""
    store = store_of(request)
    chat = await prepare_input(req, key, pipeline, store)
    shape = ResponseShape(req.model, _echo(req))
    try:
        prepared, dropped = await open_fitting(pipeline, chat.request, key, client_edits, req.truncation == "auto")
    except APIError as exc:
        if not req.stream or exc.code != FallbackCode.CONTEXT_LENGTH.value:
            raise
        stream_failed(request, exc.status)
        return ClosingStream(_failed(shape, exc), _nothing, media_type="text/event-stream")
    answer = ResponseAnswer(req, chat, shape, store, key)
    return await respond(request, prepared, answer, bool(req.stream), _headers(chat, dropped))


async def _nothing() -> None:
    return None


async def _failed(shape: ResponseShape, exc: APIError) -> AsyncIterator[str]:
    events = Events()
    yield events.frame("response.created", response=shape.body("in_progress", []))
    error = {"code": exc.code, "message": exc.message}
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
