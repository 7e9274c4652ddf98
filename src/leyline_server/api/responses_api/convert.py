"""A Responses API request as the one chat turn's request (:class:`ChatCompletionRequest`).

Tools: function tools keep their schema and ``strict``; a ``namespace`` group's functions become
``namespace.name`` functions (and calls back, see :mod:`.items`). Hosted tools the server cannot
run (``web_search``, ``file_search``, ``code_interpreter``, ``computer_use``, ``image_generation``,
``mcp``, ``local_shell``, ``custom``, ``tool_search``, ...) are **not offered to the model**, and
said so (:attr:`ChatInput.not_offered`, the ``x-leyline-tools-not-offered`` header): refusing
them would stop Codex, which always sends ``web_search``. Choosing one in ``tool_choice`` is a 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.responses_items import ItemError, chat_tools
from leyline_server.api.errors import APIError
from leyline_server.api.prompting import reasoning_effort_for
from leyline_server.api.responses_api.errors import as_api_error
from leyline_server.api.responses_api.schemas import ResponsesRequest
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["ChatInput", "to_chat"]


@dataclass
class ChatInput:
    """The chat request of a Responses request, and what of it was not offered to the model."""

    request: ChatCompletionRequest
    not_offered: list[str] = field(default_factory=list)


def _tool_choice(choice: Any, offered: Sequence[Mapping[str, Any]]) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return None if choice == "auto" and not offered else choice
    if not isinstance(choice, Mapping):
        raise APIError(400, "invalid_request", "tool_choice must be a mode or an object", "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "allowed_tools":
        tools = choice.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise APIError(400, "invalid_request", "allowed_tools needs a list of tool objects", "tool_choice.tools")
        refs = [{"type": "function", "function": {"name": t.get("name")}} for t in tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": refs}}
    raise APIError(
        400, "unsupported_parameter", f"tool_choice {kind!r}: this server runs no hosted tool", "tool_choice"
    )


def _response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type", "text") == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise APIError(400, "unsupported_parameter", f"text.format {fmt['type']!r} is not supported", "text.format.type")


def to_chat(req: ResponsesRequest, messages: list[dict[str, Any]], template: str) -> ChatInput:
    """The chat request for ``req`` with the conversation's ``messages`` (``template``: the chat
    template's source, to tell whether ``reasoning.effort`` has a switch to set)."""
    try:
        tools, not_offered = chat_tools(req.tools)
    except ItemError as exc:
        raise as_api_error(exc) from exc
    effort = (req.reasoning or {}).get("effort")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(req.tool_choice, tools),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req.text),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "logprobs": True if req.top_logprobs is not None or _wants_logprobs(req) else None,
        "top_logprobs": req.top_logprobs,
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "metadata": req.metadata,
        "stream": req.stream,
        "leyline": req.leyline.model_dump() if req.leyline is not None else None,
    }
    body["reasoning_effort"] = reasoning_effort_for(effort, template)
    return ChatInput(
        ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None}), not_offered
    )


def _wants_logprobs(req: ResponsesRequest) -> bool:
    return "message.output_text.logprobs" in (req.include or [])
