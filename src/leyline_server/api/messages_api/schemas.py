"""The Messages API's create and count-tokens requests, and what this server does with each field.

:data:`FIELDS` names every field :class:`MessagesRequest` accepts — honoured, a documented no-op,
or refused (a 400 naming it unless it holds its default); unknown fields are a 400 too.
``docs/messages.md`` lists the same table (a test keeps them equal, and checks that the anthropic
SDK's create parameters are all known).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leyline_sdk.core.wire import LeylineRequest
from leyline_server.api.carrier import lift_leyline
from leyline_server.api.fields import Field as FieldRule
from leyline_server.api.fields import honoured, noop, refuse_unsupported, refused

__all__ = ["MessagesRequest", "CountTokensRequest", "FIELDS", "refuse_unsupported_message_fields"]


_h, _noop, _no = honoured, noop, refused


FIELDS: dict[str, FieldRule] = {
    "model": _h("404 not_found_error for a model not served here"),
    "messages": _h("text, tool_use, tool_result, thinking and redacted_thinking blocks; role system inside too"),
    "system": _h("a string or text blocks: the system message"),
    "max_tokens": _h("capped to the room left in the context (x-leyline-max-tokens-capped says to what)"),
    "stop_sequences": _h("stop strings; stop_reason stop_sequence names the one met"),
    "temperature": _h("0 is greedy"),
    "top_p": _h("nucleus sampling"),
    "top_k": _h("top-k sampling"),
    "tools": _h("custom tools with input_schema; server tools (web_search, bash, ...) are not offered (reported)"),
    "tool_choice": _h("auto, any, tool (forced calls under a grammar), none; disable_parallel_tool_use"),
    "thinking": _h("the chat template's reasoning switch where it has one, else a no-op"),
    "output_config": _h("format json_schema: constrained decoding; effort: as thinking"),
    "metadata": _h("user_id names the conversation (a prompt_cache_key hint: never another user's session)"),
    "stream": _h("server-sent events in the Messages API's order"),
    "context_management": _h("clear_tool_uses_20250919 and clear_thinking_20251015, applied here and spliced"),
    "cache_control": _noop("every prompt is cached anyway (usage says what was read from the cache)"),
    "service_tier": _noop("one tier"),
    "inference_geo": _noop("one place"),
    "speed": _noop("one speed"),
    "diagnostics": _noop("nothing to diagnose here"),
    "user_profile_id": _noop("Anthropic's account options; none here"),
    "workspace_id": _noop("Anthropic's account options; none here"),
    "billing_policy": _noop("Anthropic's account options; none here"),
    "fallback_credit_token": _noop("Anthropic's account options; none here"),
    "fallbacks": _noop("one model"),
    "thread": _noop("Anthropic's thread tags; not used"),
    "container": _no("code execution containers are not supported"),
    "mcp_servers": _no("the server runs no MCP connector"),
    "compaction": _no("server-side compaction is not supported"),
    "leyline": _h("sessions and directives (the extension)"),
}


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    cache_control: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None
    leyline: LeylineRequest | None = None


class CountTokensRequest(_Base):
    """``POST /v1/messages/count_tokens``."""


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages`` (unknown fields: 400 naming them)."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool | None = None
    service_tier: Any = None
    inference_geo: Any = None
    diagnostics: Any = None
    billing_policy: Any = None
    fallback_credit_token: Any = None
    fallbacks: Any = None
    thread: Any = None
    container: Any = None
    mcp_servers: Any = None
    compaction: Any = None

    @model_validator(mode="before")
    @classmethod
    def _leyline_from_metadata(cls, data: Any) -> Any:
        """``metadata["leyline"]`` (a JSON string) is read as the ``leyline`` field (see ``api.carrier``)."""
        return lift_leyline(data)


def refuse_unsupported_message_fields(req: _Base) -> None:
    """400 naming the first refused field that holds more than its default."""
    refuse_unsupported(req.model_dump(exclude_unset=True, exclude={"messages", "leyline"}), FIELDS)
