"""A Messages API request as the chat turn's request: counted first, converted off the event loop.

The messages are counted before anything walks them (each Anthropic message is at least one chat
message: past ``--max-messages`` a 400 ``too_many_messages`` naming ``messages``); then, on a render
thread, one at a time per key (:meth:`RenderService.run`), their depth is checked, the blocks
become chat messages (:mod:`.blocks`) and the chat request is validated. The server's context
edits (:mod:`.context_edits`), which count the tokens of what they clear, run there too.

``cache_marked``: whether the request set a ``cache_control`` breakpoint — on the request, on a
system block, a message's content block (a tool result's blocks included) or a tool; text that
merely mentions ``cache_control`` is not one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from leyline_server.api.errors import APIError, invalid
from leyline_server.api.limits import check_json_depth
from leyline_server.api.messages_api.blocks import chat_tool_choice, chat_tools, drop_volatile_lines, to_chat_messages
from leyline_server.api.messages_api.context_edits import apply_context_edits
from leyline_server.api.messages_api.schemas import (
    CountTokensRequest,
    MessagesRequest,
    refuse_unsupported_message_fields,
)
from leyline_server.api.pipeline import ChatPipeline
from leyline_server.api.prompting import reasoning_effort_for, template_source
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["MessagesInput", "prepare_messages", "cache_marked"]

DEPTH_CHECKED = ("messages", "tools", "tool_choice", "output_config", "context_management", "system")


@dataclass
class MessagesInput:
    """The chat request of a Messages API request, what was not offered, and the context edits."""

    request: ChatCompletionRequest
    not_offered: list[str] = field(default_factory=list)
    applied: list[dict[str, Any]] | None = None  # context_management.applied_edits (None: not asked)
    original_tokens: int | None = None  # the prompt before the context edits
    cache_marked: bool = False  # the request set a cache_control breakpoint somewhere
    body: dict[str, Any] = field(default_factory=dict)  # the chat request's fields, before validation
    volatile: int = 0  # system prompt lines dropped as volatile (ServerConfig.volatile_system_lines)


def _blocks(value: Any) -> Iterator[Mapping[str, Any]]:
    """The blocks of a ``system`` or ``content`` value (a string has none), tool results' included."""
    for block in value if isinstance(value, list) else ():
        if isinstance(block, Mapping):
            yield block
            if block.get("type") == "tool_result":
                yield from _blocks(block.get("content"))


def cache_marked(req: CountTokensRequest) -> bool:
    """Whether ``req`` sets a ``cache_control`` breakpoint (see the module docstring)."""
    places = [req.cache_control, *(b.get("cache_control") for b in _blocks(req.system))]
    places += [b.get("cache_control") for m in req.messages for b in _blocks(m.get("content"))]
    places += [t.get("cache_control") for t in req.tools or ()]
    return any(p is not None for p in places)


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


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request of ``body`` (unset fields left out); a 400 naming the field it cannot be."""
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise invalid(exc) from exc


def _convert(req: CountTokensRequest, template: str, volatile: Sequence[str] = ()) -> MessagesInput:
    """The chat request of ``req`` before any context edit (on a render thread)."""
    for name in DEPTH_CHECKED:
        check_json_depth(getattr(req, name), name)  # before anything walks them recursively
    messages = to_chat_messages(req.system, req.messages)
    dropped = drop_volatile_lines(messages, volatile) if volatile else 0
    tools, not_offered = chat_tools(req.tools)
    body = _body(req, messages, tools)
    if (effort := reasoning_effort_for(_effort(req), template)) is not None:
        body["reasoning_effort"] = effort
    return MessagesInput(chat_request(body), not_offered, cache_marked=cache_marked(req), body=body, volatile=dropped)


async def prepare_messages(req: CountTokensRequest, key: str | None, pipeline: ChatPipeline) -> MessagesInput:
    """The chat turn's request for ``req``, after the server's context edits (see the module docstring)."""
    refuse_unsupported_message_fields(req)
    service = pipeline.service
    count, limit = len(req.messages) + (req.system is not None), service.config.max_messages
    if count > limit:
        raise APIError(400, "too_many_messages", f"{count} messages; at most {limit}", "messages")
    template = template_source(service.chat)
    volatile = service.config.volatile_system_lines
    out = await service.render.run(key, lambda _: _convert(req, template, volatile))
    if req.context_management is not None:
        out.original_tokens = await pipeline.count_tokens(out.request, key)
        tokenizer, original, management = service.tokenizer, out.original_tokens, req.context_management

        def edit(_: Any) -> MessagesInput:
            count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
            edits = apply_context_edits(out.body["messages"], management, original, count)
            out.applied = edits.applied
            out.request = chat_request({**out.body, "messages": edits.messages})
            return out

        out = await service.render.run(key, edit)
    return out
