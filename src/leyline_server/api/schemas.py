"""Request schemas of the HTTP API (responses are plain dicts in OpenAI's shapes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from leyline_sdk.directives import Directive

__all__ = [
    "BaseRef",
    "LeylineRequest",
    "ChatCompletionRequest",
    "TokenizeRequest",
    "SessionCreateRequest",
    "DirectivesRequest",
]


class BaseRef(BaseModel):
    """The client's view of a session's base: its length and digest."""

    model_config = ConfigDict(extra="forbid")

    length: int = Field(ge=0)
    digest: str | None = None


class LeylineRequest(BaseModel):
    """The ``leyline`` extension of a chat completion request."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    base: BaseRef | None = None
    directives: list[Directive] = Field(default_factory=list)
    strict: bool = False


class Message(BaseModel):
    """An OpenAI chat message (unknown fields kept)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request, with the fields this server honours."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
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
    tokens: list[int] | None = None


class DirectivesRequest(BaseModel):
    """Apply directives to a session without generating."""

    model_config = ConfigDict(extra="forbid")

    base: BaseRef | None = None
    directives: list[Directive] = Field(min_length=1)
    strict: bool = False
