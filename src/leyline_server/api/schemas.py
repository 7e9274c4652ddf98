"""Request schemas of the HTTP API. The ``leyline`` extension's models live in ``leyline_sdk.core.wire``.

Unknown request fields are refused with a 400 that names them (OpenAI does the same); fields
this server cannot honour are refused by :func:`leyline_server.api.fields.refuse_unsupported`,
never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from leyline_sdk.core.directives import Directive, Index
from leyline_sdk.core.wire import BaseRef, LeylineRequest
from leyline_server.api.carrier import lift_leyline
from leyline_server.api.errors import APIError

__all__ = [
    "BaseRef",
    "BlockCreateRequest",
    "check_content",
    "ChatCompletionRequest",
    "DirectivesRequest",
    "LeylineRequest",
    "Message",
    "SessionCreateRequest",
    "TokenizeRequest",
]


class Message(BaseModel):
    """An OpenAI chat message (unknown fields kept: chat templates may use them).

    ``content`` as a list holds text parts only (``{"type": "text", "text": ...}``); the model takes
    no images, audio or files, so any other part is refused by name (:func:`check_content`).
    """

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


def check_content(messages: Sequence[Any], param: str = "messages") -> None:
    """400 naming ``messages.<i>.content.<j>`` for a content part that is not text (messages: models or dicts)."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            where = f"{param}.{i}.content.{j}"
            if kind != "text":
                raise APIError(
                    400,
                    "unsupported_content",
                    f"content parts of type {kind!r} are not supported: this model takes text only",
                    f"{where}.type",
                )
            if not isinstance(part.get("text"), str):
                raise APIError(400, "invalid_request", "a text part needs a 'text' string", f"{where}.text")


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request plus SGLang's extra fields (others: 400).

    ``null`` means "unset" for every field but ``model`` and ``messages``. What each field does is
    :data:`leyline_server.api.fields.FIELDS`; fields typed ``Any`` are refused there by name unless
    they hold their default.
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # int64 or uint64, as samplers take
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    reasoning_effort: str | float | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    # SGLang's extra fields (sglang 0.5.23, entrypoints/openai/protocol.py)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, ge=1e-6, le=2.0)  # smaller: logits / 0 (inf, nan)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    rid: str | None = None
    return_hidden_states: Any = None
    return_routed_experts: Any = None
    routed_experts_start_len: Any = None
    return_cached_tokens_details: Any = None
    return_spec_tokens_details: Any = None
    return_prompt_token_ids: Any = None
    return_token_ids: Any = None
    return_meta_info: Any = None
    return_input_ids_in_sglext: Any = None
    return_output_ids_in_sglext: Any = None
    return_sampling_mask: Any = None
    sampling_logprobs_mode: Any = None
    return_flat_raw_output_top_logprobs: Any = None
    return_flat_raw_top_logprobs_b64: Any = None
    thinking: Any = None
    task: Any = None
    stop_regex: Any = None
    lora_path: Any = None
    session_id: Any = None
    session_params: Any = None
    max_dynamic_patch: Any = None
    min_dynamic_patch: Any = None
    use_audio_in_video: Any = None
    images_config: Any = None
    video_config: Any = None
    mm_processor_kwargs: Any = None
    custom_logit_processor: Any = None
    custom_params: Any = None
    watermark: Any = None
    input_ids: Any = None
    extra_key: Any = None
    cache_salt: Any = None
    priority: Any = None
    data_parallel_rank: Any = None
    routed_dp_rank: Any = None
    disagg_prefill_dp_rank: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    leyline: LeylineRequest | None = None

    @model_validator(mode="before")
    @classmethod
    def _leyline_from_metadata(cls, data: Any) -> Any:
        """``metadata["leyline"]`` (a JSON string) is read as the ``leyline`` field (see :mod:`.carrier`)."""
        return lift_leyline(data)


class TokenizeRequest(BaseModel):
    """Messages (+ tools) to render with the model's chat template."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True


class SessionCreateRequest(BaseModel):
    """Open a session from messages or from token ids (exactly one of them)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    tokens: list[Index] | None = None  # token ids (JSON booleans are refused, not read as 0 and 1)


class BlockCreateRequest(BaseModel):
    """Create a block from token ids or from messages (exactly one of them)."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[Index] | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    tools: list[dict[str, Any]] | None = None


class DirectivesRequest(BaseModel):
    """Apply directives to a session without generating."""

    model_config = ConfigDict(extra="forbid")

    base: BaseRef | None = None
    directives: list[Directive] = Field(min_length=1)
    strict: bool = False
