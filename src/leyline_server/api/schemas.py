"""Request schemas of the HTTP API. The ``leyline`` extension's models live in ``leyline_sdk.wire``.

Unknown request fields are refused with a 400 that names them (OpenAI does the same); fields
this server cannot honour are refused by :func:`leyline_server.api.params.sampling_params`,
never ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leyline_sdk.directives import Directive, Index
from leyline_sdk.wire import BaseRef, LeylineRequest

__all__ = [
    "BaseRef",
    "BlockCreateRequest",
    "ChatCompletionRequest",
    "DirectivesRequest",
    "LeylineRequest",
    "Message",
    "SessionCreateRequest",
    "TokenizeRequest",
]


class Message(BaseModel):
    """An OpenAI chat message (unknown fields kept: chat templates may use them)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request, every field this server knows (others: 400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # int64 or uint64, as samplers take
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # known to OpenAI, not supported here: refused with a message naming the field
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    leyline: LeylineRequest | None = None


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
