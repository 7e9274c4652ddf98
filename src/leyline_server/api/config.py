"""Server settings and limits: what the CLI's flags become."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """Server settings and limits (the CLI's flags)."""

    model_name: str
    served_model_names: tuple[str, ...] = ()
    api_keys: frozenset[str] = frozenset()
    isolate_keys: bool | None = None  # None: on when API keys are configured
    auto_splice: bool = False
    max_body_bytes: int = 8 * 2**20
    max_directives: int = 256
    max_replacement_tokens: int = 16_384
    max_context_tokens: int | None = None
    max_sessions_per_key: int = 1024
    max_sessions: int = 4096
    max_blocks_per_key: int = 256
    session_ttl_s: float = 3600.0
    default_max_tokens: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Model names requests may ask for."""
        return self.served_model_names or (self.model_name,)

    @property
    def isolated(self) -> bool:
        """Whether each API key gets its own prefix cache."""
        return bool(self.api_keys) if self.isolate_keys is None else self.isolate_keys
