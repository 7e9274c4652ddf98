"""A Responses request's input: counted first, then converted off the event loop.

The request's items are counted before anything walks them (at most
:data:`ITEMS_PER_MESSAGE` × ``--max-messages``: a 400 ``too_many_messages`` naming ``input``);
then, on a render thread, one at a time per key (:meth:`RenderService.run`), their depth is
checked, stored items are resolved (:meth:`ResponseStore.item`), sealed reasoning decoded once
per distinct text, the messages counted against the render's character budget as they are built
(:func:`~leyline_sdk.core.responses_items.to_messages`), and the chat request validated. Nothing
of that per-item work holds the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from leyline_sdk.core.responses_items import ItemError, item_id, to_messages
from leyline_server.api.errors import APIError, invalid
from leyline_server.api.limits import check_json_depth
from leyline_server.api.pipeline import ChatPipeline
from leyline_server.api.prompting import template_source
from leyline_server.api.responses_api.convert import ChatInput, to_chat
from leyline_server.api.responses_api.errors import as_api_error
from leyline_server.api.responses_api.schemas import ResponsesRequest, refuse_unsupported_response_fields
from leyline_server.api.responses_api.store import ResponseStore

__all__ = ["ITEMS_PER_MESSAGE", "prepare_input", "as_stored_items"]

# Items per chat message a request may send: reasoning items make no message of their own and
# consecutive calls join one; real conversations stay near two (a call and its output).
ITEMS_PER_MESSAGE = 4
DEPTH_CHECKED = ("input", "tools", "tool_choice", "text", "reasoning")


def _count(req: ResponsesRequest, history: list[dict[str, Any]], max_messages: int) -> None:
    items = len(req.input) if isinstance(req.input, list) else 1
    if items > ITEMS_PER_MESSAGE * max_messages or len(history) > max_messages:
        message = f"{items} input items and {len(history)} earlier messages; at most {max_messages} messages"
        raise APIError(400, "too_many_messages", message, "input")


def _history(req: ResponsesRequest, key: str | None, store: ResponseStore) -> list[dict[str, Any]]:
    if req.previous_response_id is None:
        return []
    previous = store.get(req.previous_response_id, key)
    if previous is None:
        message = f"Previous response with id {req.previous_response_id!r} not found."
        raise APIError(400, "previous_response_not_found", message, "previous_response_id")
    return previous.history


def _convert(
    req: ResponsesRequest,
    history: list[dict[str, Any]],
    resolve: Callable[[str], Mapping[str, Any] | None],
    template: str,
    max_chars: int,
) -> ChatInput:
    """The chat request of ``req`` (on a render thread)."""
    for name in DEPTH_CHECKED:
        check_json_depth(getattr(req, name), name)  # before anything walks them recursively
    try:
        messages = to_messages(req.instructions, history, req.input, resolve, max_chars)
    except ItemError as exc:
        raise as_api_error(exc) from exc
    try:
        return to_chat(req, messages, template)
    except ValidationError as exc:
        raise invalid(exc) from exc


async def prepare_input(
    req: ResponsesRequest, key: str | None, pipeline: ChatPipeline, store: ResponseStore
) -> ChatInput:
    """The chat turn's request for ``req`` (see the module docstring)."""
    refuse_unsupported_response_fields(req)
    service = pipeline.service
    history = _history(req, key, store)
    _count(req, history, service.config.max_messages)
    resolve, template, max_chars = store.item(key), template_source(service.chat), service.render.max_chars
    return await service.render.run(key, lambda _: _convert(req, history, resolve, template, max_chars))


def as_stored_items(items: Any) -> list[dict[str, Any]]:
    """The request's input as items with ids (a string: one user message), as they are stored."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": items}]}]
    out = []
    for item in items or []:
        item = dict(item)
        item.setdefault("type", "message")
        if item.get("id") is None:
            item["id"] = item_id("msg" if item["type"] == "message" else "item")
        if item["type"] == "message" and isinstance(item.get("content"), str):  # an easy message, typed
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        out.append(item)
    return out
