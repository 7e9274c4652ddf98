"""Splice planner: validate a directive set, splice the cache in place, or fall back to forget.

Index layout of an amortize splice (old = the session's base, new = ``apply(base, D)``)::

    old:  | prefix        | S_1 | run_1         | S_2 | run_2      | ... | (cut) uncached/forget tail |
    new:  | prefix (same) | R_1 | run_1 rotated | R_2 | run_2 rot. | ... | prefilled tail              |
            reused slots    new   fresh slots     new   fresh slots          fresh slots

* ``prefix`` keeps its slots (it is the common radix path).
* every downstream ``run_i`` is gather–copy–rotated into fresh slots in ONE ``rotate_copy``
  (copy-on-write: the old branch may still serve another request); rotation does not depend on
  the replacements, so it runs first;
* each ``R_i`` is prefilled after everything left of it in the new sequence, in order;
* the *cut* is the first ``forget`` start (or the end of what is cached): everything from there
  is prefilled; a layer-0 canary then checks a few rotated keys against the model's own;
* finally ``prefix + R + runs + tail`` is inserted into the radix tree and pinned.

The planner talks to the engine only through :class:`SpliceBackend` (the embedded ``Engine``
implements it; an SGLang engine is to implement the same methods over its own pool and tree).

Validation failures carry DESIGN's stable codes. By default they fall back to ``forget`` (radix
match + prefill of the new sequence, which equals a fresh prefill) and the report says why;
``strict=True`` raises :class:`SpliceError` instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import Enum
from typing import Protocol

import torch
from pydantic import BaseModel

from leyline_sdk.directives import Directive, Mode, apply, check, digest, kept_runs
from leyline_sdk.errors import DirectiveError
from leyline_server.engines.embedded.engine import CapacityError, Pinned
from leyline_server.kernels import rotate_copy
from leyline_server.rope import RopeSpec

__all__ = ["FallbackCode", "Fallback", "SpliceReport", "SpliceError", "SpliceBackend", "KVStore", "splice"]


class KVStore(Protocol):
    """The slot pool as the planner sees it: ``[L, S, H, D]`` keys, optional values, rotation counts."""

    @property
    def keys(self) -> torch.Tensor: ...
    @property
    def values(self) -> torch.Tensor | None: ...
    @property
    def rotations(self) -> torch.Tensor: ...
    @property
    def dtype(self) -> torch.dtype: ...


class SpliceBackend(Protocol):
    """What the planner needs from an engine (the embedded ``Engine`` implements it).

    Slots handed out by ``alloc``/``extend`` are the caller's until ``commit`` (which inserts
    them into the prefix cache, pins the result and unpins ``previous``) or ``release``.
    ``alloc``/``extend`` raise ``CapacityError`` when the pool is full.
    """

    spec: RopeSpec
    rotation_budget: int
    vocab_size: int

    @property
    def pool(self) -> KVStore: ...

    def alloc(self, n: int) -> torch.Tensor: ...
    def release(self, slots: torch.Tensor) -> None: ...
    def extend(
        self, context: torch.Tensor, tokens: list[int], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def match(self, tokens: list[int]) -> Pinned: ...
    def commit(self, tokens: list[int], slots: torch.Tensor, previous: Pinned | None = None) -> Pinned: ...
    def unpin(self, pinned: Pinned) -> None: ...
    def prefill(self, tokens: list[int], previous: Pinned | None = None) -> tuple[Pinned, torch.Tensor, int]: ...
    def layer0_keys(self, tokens: list[int], positions: torch.Tensor) -> torch.Tensor: ...


CANARY_TOKENS = 4
CANARY_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}


class FallbackCode(str, Enum):
    """Why a splice was not applied as asked (stable, reported to clients)."""

    BASE_MISMATCH = "base_mismatch"
    SPAN_INVALID = "span_invalid"
    TOKEN_INVALID = "token_invalid"
    PROMPT_MISMATCH = "prompt_mismatch"
    ROPE_UNSUPPORTED = "rope_unsupported"
    DRIFT_BUDGET = "drift_budget"
    CANARY_FAILED = "canary_failed"
    CAPACITY = "capacity"


class Fallback(BaseModel):
    """A fallback code with a human-readable message."""

    code: FallbackCode
    message: str


class SpliceReport(BaseModel):
    """What a splice did: counts of reused, rotated and prefilled tokens, time, fallback."""

    applied: bool
    fallback: Fallback | None = None
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    splice_ms: float = 0.0


class SpliceError(Exception):
    """Raised instead of falling back when the request is strict."""

    def __init__(self, code: FallbackCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class _Refused(Exception):
    def __init__(self, code: FallbackCode, message: str) -> None:
        self.code, self.message = code, message


def _validate(
    engine: SpliceBackend,
    base: list[int],
    directives: Sequence[Directive],
    base_length: int | None,
    base_digest: str | None,
    prompt: Sequence[int] | None,
) -> list[int]:
    if base_length is not None and base_length != len(base):
        raise _Refused(FallbackCode.BASE_MISMATCH, f"client base length {base_length}, server has {len(base)}")
    if base_digest is not None and base_digest != digest(base):
        raise _Refused(FallbackCode.BASE_MISMATCH, "client base digest differs from the server's")
    try:
        check(directives, len(base))
    except DirectiveError as exc:
        raise _Refused(FallbackCode.SPAN_INVALID, str(exc)) from exc
    for i, d in enumerate(directives):
        bad = [t for t in d.replacement if t >= engine.vocab_size]
        if bad:
            raise _Refused(
                FallbackCode.TOKEN_INVALID,
                f"directive {i}: token {bad[0]} >= vocab size {engine.vocab_size}",
            )
    new = apply(base, directives)
    if prompt is not None and list(prompt[: len(new)]) != new:
        raise _Refused(FallbackCode.PROMPT_MISMATCH, "apply(base, directives) is not a prefix of the prompt")
    return new


def _forget(
    engine: SpliceBackend, pinned: Pinned, new: list[int], started: float, fallback: Fallback | None
) -> tuple[Pinned, SpliceReport]:
    # Unpin first: the common prefix is re-matched and locked by prefill, and the old branch
    # becomes evictable, so a forget fits where the splice (which must keep it) did not.
    engine.unpin(pinned)
    if not new:  # everything deleted: an empty session
        return engine.match([]), SpliceReport(applied=fallback is None, fallback=fallback)
    fresh, _, reused = engine.prefill(new)
    report = SpliceReport(
        applied=fallback is None,
        fallback=fallback,
        reused_tokens=reused,
        prefilled_tokens=len(new) - reused,
        splice_ms=(time.perf_counter() - started) * 1e3,
    )
    return fresh, report


def _canary(engine: SpliceBackend, tokens: list[int], slots: torch.Tensor, positions: torch.Tensor) -> None:
    if slots.numel() == 0:
        return
    pick = torch.linspace(0, slots.numel() - 1, min(CANARY_TOKENS, slots.numel())).round().long().unique()
    expected = engine.layer0_keys([tokens[i] for i in pick.tolist()], positions[pick])
    actual = engine.pool.keys[0].index_select(0, slots[pick]).float()
    err = (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)
    if err > CANARY_TOLERANCE.get(engine.pool.dtype, 1e-2):
        raise _Refused(FallbackCode.CANARY_FAILED, f"layer-0 keys off by {err:.2e} (relative) after rotation")


def _amortize(
    engine: SpliceBackend, pinned: Pinned, directives: Sequence[Directive], new: list[int], started: float
) -> tuple[Pinned, SpliceReport]:
    base = pinned.tokens
    cached = len(pinned.slots)
    limit = min([cached] + [d.start for d in directives if d.mode is Mode.FORGET])
    for d in directives:  # never cut through a directive
        if d.start < limit < d.end:
            limit = d.start
    spliced = [d for d in directives if d.start < limit]
    runs = kept_runs(limit, spliced)
    new_limit = limit + sum(d.delta for d in spliced)

    if not engine.spec.shiftable and any(r.shift for r in runs):
        raise _Refused(FallbackCode.ROPE_UNSUPPORTED, engine.spec.reason or "RoPE not shiftable")
    # the leading run keeps its slots when nothing before it moved it (it is the shared radix path)
    prefix = runs[0] if runs and runs[0].old_start == 0 and runs[0].shift == 0 else None
    moved = [r for r in runs if r is not prefix]
    src = (
        torch.cat([pinned.slots[r.old_start : r.old_end] for r in moved])
        if moved
        else torch.empty(0, dtype=torch.int64)
    )
    old_pos = (
        torch.cat([torch.arange(r.old_start, r.old_end) for r in moved]) if moved else torch.empty(0, dtype=torch.int64)
    )
    new_pos = (
        torch.cat([torch.arange(r.new_start, r.new_start + r.old_end - r.old_start) for r in moved])
        if moved
        else old_pos
    )
    rotations = engine.pool.rotations[src] + (new_pos != old_pos).int() if moved else torch.empty(0, dtype=torch.int32)
    if moved and int(rotations.max()) > engine.rotation_budget:
        raise _Refused(
            FallbackCode.DRIFT_BUDGET,
            f"a slot would pass its rotation budget of {engine.rotation_budget}",
        )

    allocated: list[torch.Tensor] = []
    try:
        new_slots = torch.full((new_limit,), -1, dtype=torch.int64)
        if prefix is not None:
            new_slots[: prefix.old_end] = pinned.slots[: prefix.old_end]
        if moved:
            dst = engine.alloc(src.numel())
            allocated.append(dst)
            rotate_copy(engine.pool.keys, src, dst, old_pos, new_pos, engine.spec, values=engine.pool.values)
            engine.pool.rotations[dst] = rotations
            new_slots[new_pos] = dst
            _canary(engine, [base[p] for p in old_pos.tolist()], dst, new_pos)
        prefilled = 0
        shift = 0
        for d in spliced:  # replacements, left to right, each after everything before it
            at = d.start + shift
            shift += d.delta
            if d.replacement:
                slots, _ = engine.extend(new_slots[:at], list(d.replacement), torch.arange(at, at + len(d.replacement)))
                allocated.append(slots)
                new_slots[at : at + len(d.replacement)] = slots
                prefilled += len(d.replacement)
        assert bool((new_slots >= 0).all()), "splice left a hole"
        tail = new[new_limit:]
        if tail:
            slots, _ = engine.extend(new_slots, tail, torch.arange(new_limit, len(new)))
            allocated.append(slots)
            new_slots = torch.cat([new_slots, slots])
            prefilled += len(tail)
    except BaseException:
        for slots in allocated:
            engine.release(slots)
        raise
    fresh = engine.commit(new, new_slots, previous=pinned)
    report = SpliceReport(
        applied=True,
        reused_tokens=prefix.old_end if prefix else 0,
        rotated_tokens=int(src.numel()),
        prefilled_tokens=prefilled,
        splice_ms=(time.perf_counter() - started) * 1e3,
    )
    return fresh, report


def splice(
    engine: SpliceBackend,
    pinned: Pinned,
    directives: Sequence[Directive],
    *,
    base_length: int | None = None,
    base_digest: str | None = None,
    prompt: Sequence[int] | None = None,
    strict: bool = False,
) -> tuple[Pinned, SpliceReport]:
    """Apply ``directives`` to the session cached as ``pinned``; return the new pin and a report.

    ``pinned`` is consumed (unlocked) on success and on fallback. When the directives cannot even
    be applied to the base (``base_mismatch``, ``span_invalid``, ``token_invalid``) and no
    ``prompt`` is given, nothing changes: the old pin comes back with ``applied=False``; with a
    prompt, the fallback re-prefills the prompt.
    """
    started = time.perf_counter()
    new: list[int] | None = None
    try:
        new = _validate(engine, pinned.tokens, directives, base_length, base_digest, prompt)
        if all(d.mode is Mode.FORGET for d in directives) or not directives:
            return _forget(engine, pinned, new, started, None)
        return _amortize(engine, pinned, directives, new, started)
    except (_Refused, CapacityError) as exc:
        code, message = (exc.code, exc.message) if isinstance(exc, _Refused) else (FallbackCode.CAPACITY, str(exc))
        if strict:
            raise SpliceError(code, message) from exc
        fallback = Fallback(code=code, message=message)
        target = new if new is not None else (list(prompt) if prompt is not None else None)
        if target is None:
            return pinned, SpliceReport(
                applied=False, fallback=fallback, splice_ms=(time.perf_counter() - started) * 1e3
            )
        return _forget(engine, pinned, target, started, fallback)
