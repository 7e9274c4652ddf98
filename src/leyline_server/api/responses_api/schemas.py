"""The Responses API's create request, and what this server does with each of its fields.

:data:`FIELDS` names every field :class:`ResponsesRequest` accepts — honoured, a documented
no-op, or refused (a 400 naming it unless it holds its default); unknown fields are a 400 too.
``docs/responses.md`` lists the same table (a test keeps them equal).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leyline_sdk.core.wire import LeylineRequest
from leyline_server.api.carrier import lift_leyline
from leyline_server.api.errors import APIError
from leyline_server.api.fields import Field as FieldRule
from leyline_server.api.fields import honoured, noop, refuse_unsupported, refused

__all__ = ["ResponsesRequest", "FIELDS", "refuse_unsupported_response_fields"]


_h, _noop, _no = honoured, noop, refused


FIELDS: dict[str, FieldRule] = {
    "model": _h("404 model_not_found for a model not served here"),
    "input": _h("a string, or message / function_call / function_call_output / reasoning / item_reference items"),
    "instructions": _h("a system message first; not carried over from previous_response_id (OpenAI's rule)"),
    "tools": _h("function tools (strict honoured) and namespace groups; hosted tools are not offered (reported)"),
    "tool_choice": _h("none, auto, required, a named function, allowed_tools (forced calls under a grammar)"),
    "parallel_tool_calls": _h("false: at most one call"),
    "max_output_tokens": _h("the completion limit (without it the completion may fill the context)"),
    "max_tool_calls": _h("calls past this many are dropped from the answer"),
    "temperature": _h("0 is greedy"),
    "top_p": _h("nucleus sampling"),
    "top_logprobs": _h("0 to 20 alternatives per output token, in output_text.logprobs"),
    "text": _h("format text, json_object or json_schema (constrained decoding); verbosity: a no-op"),
    "reasoning": _h("effort: the chat template's reasoning switch where it has one, else a no-op; summary: a no-op"),
    "store": _h("stored responses (the default): bounded per key, private to it, least recently used first out"),
    "previous_response_id": _h("continues a stored response of this key (an exact prefix hit)"),
    "truncation": _h("auto: the oldest items dropped until the prompt fits (an edit like any other)"),
    "include": _h("reasoning.encrypted_content: reasoning items carry it; message.output_text.logprobs; others no-op"),
    "metadata": _h("stored with the response and returned"),
    "user": _h("a hint of whose conversation it is (a session of another user is never continued)"),
    "safety_identifier": _h("as user"),
    "prompt_cache_key": _h("names the conversation (how Codex's next request finds its session)"),
    "prompt_cache_retention": _noop("cached prefixes live until evicted"),
    "prompt_cache_options": _noop("the prefix cache is automatic"),
    "service_tier": _noop("one tier; echoed as 'default'"),
    "stream": _h("server-sent events in the Responses API's order, with sequence_number"),
    "stream_options": _h("include_obfuscation: a no-op (there is no obfuscation)"),
    "background": _no("background responses are not supported", False),
    "background_options": _no("background responses are not supported"),
    "image": _no("image options: this server generates no images"),
    "access_programs": _noop("OpenAI's domain-specific programs; none here"),
    "conversation": _no("conversations objects are not supported; use previous_response_id or send the items"),
    "context_management": _no("server-side compaction is not supported"),
    "prompt": _no("prompt templates are not supported"),
    "moderation": _noop("nothing is moderated here"),
    "client_metadata": _noop("Codex's client tags; not used"),
    "leyline": _h("sessions and directives (the extension)"),
}


class ResponsesRequest(BaseModel):
    """``POST /v1/responses`` (unknown fields: 400 naming them)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    truncation: str | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    service_tier: str | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    background: bool | None = None
    background_options: Any = None
    image: Any = None
    access_programs: Any = None
    conversation: Any = None
    context_management: Any = None
    prompt: Any = None
    moderation: Any = None
    client_metadata: Any = None
    leyline: LeylineRequest | None = None

    @model_validator(mode="before")
    @classmethod
    def _leyline_from_metadata(cls, data: Any) -> Any:
        """``metadata["leyline"]`` (a JSON string) is read as the ``leyline`` field (see ``api.carrier``)."""
        return lift_leyline(data)


def refuse_unsupported_response_fields(req: ResponsesRequest) -> None:
    """400 ``unsupported_parameter`` naming the first refused field that holds more than its default."""
    refuse_unsupported(req.model_dump(exclude_unset=True, exclude={"input", "leyline"}), FIELDS)
    if req.truncation not in (None, "auto", "disabled"):
        raise APIError(400, "invalid_request", "truncation must be 'auto' or 'disabled'", "truncation")
