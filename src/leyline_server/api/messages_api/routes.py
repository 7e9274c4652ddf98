"""``/v1/messages``: Anthropic's Messages API as an adapter onto the one chat turn.

``POST /v1/messages`` (streamed or not; ``?beta=true`` as Claude Code sends it) and
``POST /v1/messages/count_tokens``. The request becomes a chat turn (:mod:`.blocks`; the
server's context editing, :mod:`.context_edits`), the pipeline runs it — sessions, directives,
conversation recognition, structured outputs, admission, limits: nothing here is a second copy
— and its result becomes content blocks and events (:mod:`.events`). ``max_tokens`` past the
room left in the context is capped to the room (``x-leyline-max-tokens-capped``). Errors come in
Anthropic's shape (:func:`~leyline_server.api.errors.error_body`). The key may come as
``x-api-key``; ``anthropic-version`` and ``anthropic-beta`` are accepted as they are.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.disconnect import GONE_STATUS, ClientGone, unless_gone
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.limits import check_json_depth
from leyline_server.api.messages_api.blocks import (
    answer_blocks,
    chat_tool_choice,
    chat_tools,
    stop_reason,
    to_chat_messages,
)
from leyline_server.api.messages_api.context_edits import apply_context_edits
from leyline_server.api.messages_api.events import BlockStream, frame, message_body, message_usage, new_message_id
from leyline_server.api.messages_api.schemas import (
    CountTokensRequest,
    MessagesRequest,
    refuse_unsupported_message_fields,
)
from leyline_server.api.pipeline import ChatPipeline, OpenTurn
from leyline_server.api.prompting import template_source
from leyline_server.api.responses_api.convert import REASONING_SWITCHES
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.streaming import ClosingStream

__all__ = ["router"]

router = APIRouter()
log = logging.getLogger("leyline.api")
PATH = "/v1/messages"


@dataclass
class MessagesInput:
    """The chat request of a Messages API request, what was not offered, and the context edits."""

    request: ChatCompletionRequest
    not_offered: list[str] = field(default_factory=list)
    applied: list[dict[str, Any]] | None = None  # context_management.applied_edits (None: not asked)
    original_tokens: int | None = None  # the prompt before the context edits
    cache_marked: bool = False  # the request set a cache_control breakpoint somewhere


def _effort(req: CountTokensRequest) -> str | None:
    effort = (req.output_config or {}).get("effort")
    if effort is None and (req.thinking or {}).get("type") in ("enabled", "adaptive"):
        effort = "medium"
    return effort if isinstance(effort, str) else None


def _response_format(req: CountTokensRequest) -> dict[str, Any] | None:
    fmt = (req.output_config or {}).get("format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") != "json_schema":
        raise APIError(400, "unsupported_parameter", f"output format {fmt.get('type')!r}", "output_config.format.type")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.get("schema") or {}}}


def _body(req: CountTokensRequest, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    choice, parallel = chat_tool_choice(req.tool_choice, bool(tools))
    body: dict[str, Any] = {"model": req.model, "messages": messages, "tools": tools or None, "tool_choice": choice,
                            "parallel_tool_calls": parallel, "response_format": _response_format(req),
                            "leyline": req.leyline.model_dump() if req.leyline is not None else None}  # fmt: skip
    if isinstance(req, MessagesRequest):
        user = (req.metadata or {}).get("user_id")
        body.update(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k, stream=req.stream,
                    prompt_cache_key=user if isinstance(user, str) else None)  # fmt: skip
    return body


async def _prepared(req: CountTokensRequest, key: str | None, pipeline: ChatPipeline) -> MessagesInput:
    refuse_unsupported_message_fields(req)
    for name in ("messages", "tools", "tool_choice", "output_config", "context_management", "system"):
        check_json_depth(getattr(req, name), name)  # before anything walks them recursively
    messages = to_chat_messages(req.system, req.messages)
    tools, not_offered = chat_tools(req.tools)
    body = _body(req, messages, tools)
    effort = _effort(req)
    if effort is not None and any(name in template_source(pipeline.service.chat) for name in REASONING_SWITCHES):
        body["reasoning_effort"] = effort
    chat = _chat(body)
    out = MessagesInput(chat, not_offered, cache_marked="cache_control" in req.model_dump_json(exclude_none=True))
    if req.context_management is not None:
        out.original_tokens = await pipeline.count_tokens(chat, key)
        tokenizer = pipeline.service.tokenizer
        edits = apply_context_edits(messages, req.context_management, out.original_tokens,
                                    lambda text: len(tokenizer.encode(text, add_special_tokens=False)))  # fmt: skip
        out.applied = edits.applied
        out.request = _chat({**body, "messages": edits.messages})
    return out


def _chat(body: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


@router.post("/v1/messages", response_model=None)
async def create_message(
    req: MessagesRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Any:
    """Anthropic's Messages API on the one chat turn (see the module docstring)."""
    prepared = await _prepared(req, key, pipeline)
    turn = await pipeline.open(prepared.request, key, client_edits, recognise=True, cap_max_tokens=True)
    headers = turn.headers()
    if prepared.not_offered:
        headers["x-leyline-tools-not-offered"] = ",".join(prepared.not_offered)
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
    events = _events(turn, req, prepared, message_id)
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


async def _events(turn: OpenTurn, req: MessagesRequest, prepared: MessagesInput, message_id: str) -> AsyncIterator[str]:
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
        yield frame(error_body(exc.status, exc.code, exc.message, exc.param, PATH))
    except Exception as exc:
        log.exception("message %s failed", message_id)
        yield frame(error_body(500, "server_error", f"generation failed: {exc}", None, PATH))


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, key: Owner, pipeline: Pipeline) -> dict[str, Any]:
    """The prompt's length in tokens (after the server's context edits, when asked)."""
    prepared = await _prepared(req, key, pipeline)
    out: dict[str, Any] = {"input_tokens": await pipeline.count_tokens(prepared.request, key)}
    if prepared.original_tokens is not None:
        out["context_management"] = {"original_input_tokens": prepared.original_tokens}
    return out
