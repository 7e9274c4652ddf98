"""The per-request limits checked before any work: directive counts and sizes, token lists, and
directive results against the context (400s naming the field; see :mod:`.service`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from leyline_sdk.core.directives import Directive, check
from leyline_sdk.core.errors import DirectiveError
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.api.config import ServerConfig
from leyline_server.api.errors import APIError
from leyline_server.contract.values import Handle

__all__ = [
    "MAX_JSON_DEPTH",
    "check_directives",
    "check_tokens",
    "json_depth",
    "check_json_depth",
    "overflow",
    "result_length",
    "overflowing_directive",
]

# How deep client JSON that the server walks (schemas, tools, the carrier) may nest: objects and
# arrays inside each other. Real schemas stay far below (OpenAI's strict mode allows 10 levels of
# object nesting, ~20 here); Python's recursive walkers (jsonschema, deepcopy) fail near 150.
MAX_JSON_DEPTH = 64


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` nests (a scalar: 0), counted without recursion; stops past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Sequence[object] = list(item.values())
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_json_depth(value: object, param: str, limit: int = MAX_JSON_DEPTH) -> None:
    """400 ``too_deep`` naming ``param`` when ``value`` nests deeper than ``limit``."""
    if json_depth(value, limit) > limit:
        raise APIError(400, "too_deep", f"nested deeper than {limit} levels", param)


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
        raise APIError(400, FallbackCode.TOKEN_INVALID.value, f"token {bad[0]} is outside the vocabulary", param)
    if len(tokens) > context:
        raise APIError(400, FallbackCode.CONTEXT_LENGTH.value, f"more than {context} tokens", param)


def overflow(
    base: int, directives: Sequence[Directive], blocks: Mapping[str, Handle], context: int
) -> tuple[int, str] | None:
    """(index, message) of the directive whose result would pass the context, or ``None``."""
    over = overflowing_directive(base, directives, blocks, context)
    if over is None:
        return None
    i, length = over
    return i, f"directive {i}: the result would be {length} tokens long (from {base}); the context holds {context}"


def result_length(base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> int | None:
    """``len(apply(base, directives))`` without applying them; ``None`` when they do not apply to
    the base at all (the splice reports that as ``span_invalid``)."""
    deltas = _deltas(base_length, directives, blocks)
    return None if deltas is None else base_length + sum(deltas)


def overflowing_directive(
    base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle], limit: int
) -> tuple[int, int] | None:
    """``(i, length)`` when ``apply(base, directives)`` would be longer than ``limit`` tokens: ``i`` is
    the first directive whose running result passes it. ``None`` when it fits or does not apply."""
    deltas = _deltas(base_length, directives, blocks)
    if deltas is None or base_length + sum(deltas) <= limit:
        return None
    running = base_length
    for i, delta in enumerate(deltas):
        running += delta
        if running > limit:
            return i, base_length + sum(deltas)
    raise AssertionError("the last running length is the total")


def _deltas(base_length: int, directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> list[int] | None:
    try:
        check(directives, base_length)
    except DirectiveError:
        return None
    return _deltas_of(directives, blocks)


def _deltas_of(directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> list[int]:
    """How much each directive changes the length (a named block's tokens stand in for an empty replacement)."""
    out = []
    for d in directives:
        block = blocks.get(d.block) if d.block is not None else None
        size = len(block.tokens) if block is not None and not d.replacement else len(d.replacement)
        out.append(size - (d.end - d.start))
    return out
