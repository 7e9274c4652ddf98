"""Server settings and limits: what the CLI's flags become."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from leyline_server.models import real_model

__all__ = ["ServerConfig", "CHARS_PER_TOKEN"]

CHARS_PER_TOKEN = 32  # a rendered prompt may hold at most this many characters per token of context


@dataclass(frozen=True)
class ServerConfig:
    """Server settings and limits (the CLI's flags).

    Admission (see :mod:`leyline_server.api.admission`): ``max_concurrent_per_key`` requests in
    flight per key, their KV within ``kv_share_per_key`` of the pool (ignored without API keys:
    one tenant), a wait of at most ``admission_timeout_s`` before a 429, and streams whose client
    stops reading ended after ``stream_stall_timeout_s``. A stream sends a keep-alive every
    ``stream_keepalive_s`` while its prefill runs (see :mod:`leyline_server.api.answer`). Rendering (see
    :mod:`leyline_server.api.render`): at most ``max_messages`` messages, ``CHARS_PER_TOKEN``
    characters per token of context, ``render_timeout_s`` seconds. Constraints (see
    :mod:`leyline_server.api.compiles`): a compile answers within ``compile_timeout_s``.
    """

    model_name: str
    served_model_names: tuple[str, ...] = ()
    api_keys: frozenset[str] = frozenset()
    isolate_keys: bool | None = None  # None: on when API keys are configured
    auto_splice: bool = False
    client_edits: Literal["exact", "amortize"] = "exact"  # plain clients' own edits, unless the request says
    # Lines of a Messages API system prompt dropped before rendering (they start with one of these):
    # per-conversation noise that carries nothing for the model (Claude Code's attribution line).
    volatile_system_lines: tuple[str, ...] = ("x-anthropic-billing-header:",)
    max_body_bytes: int = 8 * 2**20
    max_directives: int = 256
    max_replacement_tokens: int = 16_384
    max_context_tokens: int | None = None
    max_sessions_per_key: int = 1024
    max_sessions: int = 4096
    max_blocks_per_key: int = 256
    session_ttl_s: float = 3600.0
    default_max_tokens: int | None = None
    max_messages: int = 2048
    render_timeout_s: float = 10.0
    render_threads: int = 4
    compile_timeout_s: float = 10.0
    max_concurrent_per_key: int = 64
    kv_share_per_key: float = 0.5
    admission_timeout_s: float = 30.0
    stream_stall_timeout_s: float = 60.0
    stream_keepalive_s: float = 5.0
    responses_per_key: int = 256  # stored responses (store: true), least recently used first out
    responses_tokens_per_key: int = 4_000_000
    responses_bytes_per_key: int = 64 * 2**20  # the JSON of what is kept: responses, input items, history
    responses_ttl_s: float = 3600.0
    # Sampling fields a request leaves unset: None = the model's own (a real model preset's upstream
    # generation config, else OpenAI's: temperature 1, top_p 1); {} = OpenAI's; or these values.
    sampling_defaults: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        positive = {
            "max_body_bytes": self.max_body_bytes,
            "max_messages": self.max_messages,
            "render_timeout_s": self.render_timeout_s,
            "render_threads": self.render_threads,
            "compile_timeout_s": self.compile_timeout_s,
            "max_concurrent_per_key": self.max_concurrent_per_key,
            "stream_stall_timeout_s": self.stream_stall_timeout_s,
            "stream_keepalive_s": self.stream_keepalive_s,
            "responses_per_key": self.responses_per_key,
            "responses_tokens_per_key": self.responses_tokens_per_key,
            "responses_bytes_per_key": self.responses_bytes_per_key,
            "responses_ttl_s": self.responses_ttl_s,
            "default_max_tokens": 1 if self.default_max_tokens is None else self.default_max_tokens,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.kv_share_per_key <= 1:
            raise ValueError("kv_share_per_key must lie in (0, 1]")
        if self.admission_timeout_s < 0:
            raise ValueError("admission_timeout_s must be 0 or more")

    @property
    def sampling(self) -> dict[str, float]:
        """The values a request's unset sampling fields take (see ``sampling_defaults``)."""
        if self.sampling_defaults is not None:
            return dict(self.sampling_defaults)
        preset = real_model(self.model_name)
        return dict(preset.sampling) if preset is not None else {}

    @property
    def names(self) -> tuple[str, ...]:
        """Model names requests may ask for."""
        return self.served_model_names or (self.model_name,)

    @property
    def isolated(self) -> bool:
        """Whether each API key gets its own prefix cache."""
        return bool(self.api_keys) if self.isolate_keys is None else self.isolate_keys

    @property
    def key_share(self) -> float:
        """The fraction of the KV pool one key's requests in flight may hold (1 without API keys)."""
        return self.kv_share_per_key if self.api_keys else 1.0
