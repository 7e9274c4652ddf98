"""The per-request limits checked before any work: directive counts and sizes, token lists, and
directive results against the context (400s naming the field; see :mod:`.service`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from leyline_sdk.core.directives import Directive
from leyline_server.api.config import ServerConfig
from leyline_server.api.errors import APIError
from leyline_server.api.splicing import overflowing_directive
from leyline_server.engines.base import Handle

__all__ = ["check_directives", "check_tokens", "overflow"]


def check_directives(config: ServerConfig, directives: Sequence[Directive], param: str) -> None:
    """At most ``max_directives`` directives, each replacement at most ``max_replacement_tokens``."""
    if len(directives) > config.max_directives:
        raise APIError(400, "too_many_directives", f"at most {config.max_directives} directives", param)
    for i, d in enumerate(directives):
        if len(d.replacement) > config.max_replacement_tokens:
            raise APIError(
                400,
                "replacement_too_long",
                f"directive {i}: replacement longer than {config.max_replacement_tokens} tokens",
                f"{param}.{i}.replacement",
            )


def check_tokens(tokens: Sequence[int], vocab_size: int, context: int, param: str) -> None:
    """Token ids must exist in the vocabulary, and fit the context."""
    bad = [t for t in tokens if t < 0 or t >= vocab_size]
    if bad:
        raise APIError(400, "token_invalid", f"token {bad[0]} is outside the vocabulary", param)
    if len(tokens) > context:
        raise APIError(400, "context_length_exceeded", f"more than {context} tokens", param)


def overflow(
    base: int, directives: Sequence[Directive], blocks: Mapping[str, Handle], context: int
) -> tuple[int, str] | None:
    """(index, message) of the directive whose result would pass the context, or ``None``."""
    over = overflowing_directive(base, directives, blocks, context)
    if over is None:
        return None
    i, length = over
    return i, f"directive {i}: the result would be {length} tokens long (from {base}); the context holds {context}"
