"""The directive algebra: the single definition of what a cache edit means.

A directive ``(start, end, replacement, mode)`` replaces the base tokens ``[start, end)`` by
``replacement``. ``start == end`` is a pure insertion, an empty replacement a pure deletion.
Several directives are applied together: they must be sorted by ``start`` and must not overlap
(``end_i <= start_{i+1}``); all indices refer to the *base* sequence, never to the result of an
earlier directive.

Everything here is pure and I/O-free; SDK, server and tests share it::

    base = [1, 2, 3, 4, 5]
    apply(base, [Directive(start=1, end=3, replacement=[9])])  # -> [1, 9, 4, 5]
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from leyline_sdk.core.errors import DirectiveError

__all__ = [
    "Mode",
    "Directive",
    "Index",
    "KeptRun",
    "apply",
    "check",
    "kept_runs",
    "position_map",
    "digest",
    "first_forget_start",
    "truncate_result",
]

MAX_TOKEN_ID = 2**32 - 1


def _not_bool(value: Any) -> Any:
    """JSON ``true`` is not the number 1 here (pydantic would read it as 1)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a token id or an index")
    return value


Index = Annotated[NonNegativeInt, BeforeValidator(_not_bool)]  # a position, count or token id (no booleans)


class Mode(str, Enum):
    """How the server realises a directive.

    ``amortize`` splices the cache in place (downstream KV kept, only its rotary part re-rotated);
    ``forget`` recomputes everything from the directive's start (true forgetting).
    """

    AMORTIZE = "amortize"
    FORGET = "forget"


class Directive(BaseModel):
    """Replace base tokens ``[start, end)`` by ``replacement`` (token ids), realised per ``mode``.

    The JSON wire form is ``{"start", "end", "replacement", "mode"}``, plus two optional fields:

    * ``repair`` (amortize only) — *seam repair*: the first ``repair`` tokens after the
      replacement get fresh KV (computed against the new context) instead of rotated KV;
    * ``block`` — the id of a precompiled KV block (``POST /v1/leyline/blocks``) whose tokens are
      the replacement: the server relocates the block's KV instead of prefilling it. The
      replacement may be left empty on the wire (the server fills in the block's tokens); where
      it is given it must equal them.

    Invalid values raise a pydantic ``ValidationError`` that names the field; nothing is clamped.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: Index
    end: Index
    replacement: tuple[Index, ...] = Field(default=())
    mode: Mode = Mode.AMORTIZE
    repair: Index = 0
    block: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("end")
    @classmethod
    def _end_not_before_start(cls, end: int, info: ValidationInfo) -> int:
        start = info.data.get("start")
        if start is not None and end < start:
            raise ValueError(f"end ({end}) must be >= start ({start})")
        return end

    @field_validator("replacement")
    @classmethod
    def _token_ids_fit(cls, replacement: tuple[int, ...]) -> tuple[int, ...]:
        if any(t > MAX_TOKEN_ID for t in replacement):
            raise ValueError(f"token ids must be < 2**32 (got {max(replacement)})")
        return replacement

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The wire form leaves out ``repair`` and ``block`` when they are not used."""
        data: dict[str, Any] = handler(self)
        if not self.repair:
            data.pop("repair", None)
        if self.block is None:
            data.pop("block", None)
        return data

    @property
    def delta(self) -> int:
        """How much this directive shifts every downstream position."""
        return len(self.replacement) - (self.end - self.start)


class KeptRun(NamedTuple):
    """A maximal run of base tokens ``[old_start, old_end)`` that survives, now at ``new_start``."""

    old_start: int
    old_end: int
    new_start: int

    @property
    def shift(self) -> int:
        """New position minus old position for every token of the run."""
        return self.new_start - self.old_start


def check(directives: Sequence[Directive], base_length: int) -> None:
    """Raise :class:`DirectiveError` unless ``directives`` apply to a base of ``base_length``.

    The error names the offending directive's index and field: out of range (``end`` past the
    base), unsorted (``start`` before the previous one) or overlapping (``start`` before the
    previous ``end``).
    """
    if base_length < 0:
        raise DirectiveError("base_length must be >= 0", field="base_length")
    previous_end = 0
    previous_start = 0
    for i, d in enumerate(directives):
        if d.end > base_length:
            raise DirectiveError(
                f"directive {i}: end={d.end} is past the base length {base_length}",
                index=i,
                field="end",
            )
        if i > 0 and d.start < previous_start:
            raise DirectiveError(
                f"directive {i}: start={d.start} is before directive {i - 1}'s start="
                f"{previous_start}; directives must be sorted by start",
                index=i,
                field="start",
            )
        if i > 0 and d.start < previous_end:
            raise DirectiveError(
                f"directive {i}: start={d.start} overlaps directive {i - 1} (which ends at {previous_end})",
                index=i,
                field="start",
            )
        previous_start, previous_end = d.start, d.end


def apply(base: Sequence[int], directives: Sequence[Directive]) -> list[int]:
    """Return the token sequence that results from applying ``directives`` to ``base``."""
    check(directives, len(base))
    out: list[int] = []
    cursor = 0
    for d in directives:
        out.extend(base[cursor : d.start])
        out.extend(d.replacement)
        cursor = d.end
    out.extend(base[cursor:])
    return out


def kept_runs(base_length: int, directives: Sequence[Directive]) -> list[KeptRun]:
    """The surviving base runs and where each lands, in order (empty runs omitted)."""
    check(directives, base_length)
    runs: list[KeptRun] = []
    cursor = 0
    shift = 0
    for d in directives:
        if d.start > cursor:
            runs.append(KeptRun(cursor, d.start, cursor + shift))
        shift += d.delta
        cursor = d.end
    if base_length > cursor:
        runs.append(KeptRun(cursor, base_length, cursor + shift))
    return runs


def position_map(base_length: int, directives: Sequence[Directive]) -> list[int | None]:
    """For each base position, its position after the edit, or ``None`` if it was replaced."""
    new_positions: list[int | None] = [None] * base_length
    for run in kept_runs(base_length, directives):
        length = run.old_end - run.old_start
        new_positions[run.old_start : run.old_end] = range(run.new_start, run.new_start + length)
    return new_positions


def first_forget_start(directives: Sequence[Directive]) -> int | None:
    """Base index from which everything is recomputed, or ``None`` when all are ``amortize``."""
    starts = [d.start for d in directives if d.mode is Mode.FORGET]
    return min(starts) if starts else None


def truncate_result(base_length: int, directives: Sequence[Directive], length: int) -> list[Directive]:
    """Directives whose result is the first ``length`` tokens of ``apply(base, directives)``.

    The cut is one ``forget`` directive that drops everything after it (merged into the
    directive whose replacement it falls in); directives wholly before the cut are kept as they
    are. ``length`` at or past the result's end returns ``directives`` unchanged.
    """
    check(directives, base_length)
    if length >= base_length + sum(d.delta for d in directives):
        return list(directives)
    out: list[Directive] = []
    pos = 0  # position in the result
    cursor = 0  # position in the base
    for d in directives:
        kept = d.start - cursor  # base tokens copied before d
        if pos + kept >= length:
            break
        pos += kept
        if pos + len(d.replacement) > length:  # the cut falls inside d's replacement
            out.append(
                Directive(start=d.start, end=base_length, replacement=d.replacement[: length - pos], mode=Mode.FORGET)
            )
            return out
        pos += len(d.replacement)
        cursor = d.end
        out.append(d)
    cut = cursor + (length - pos)
    if cut < base_length:
        out.append(Directive(start=cut, end=base_length, mode=Mode.FORGET))
    return out


def digest(tokens: Sequence[int]) -> str:
    """A stable digest of a token sequence (same value on every process and machine).

    SHA-256 over the ids as little-endian uint32, prefixed with the algorithm name.
    """
    h = hashlib.sha256()
    chunk = 65536
    for i in range(0, len(tokens), chunk):
        part = tokens[i : i + chunk]
        try:
            h.update(struct.pack(f"<{len(part)}I", *part))
        except struct.error as exc:
            raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from exc
    return "sha256:" + h.hexdigest()[:32]
