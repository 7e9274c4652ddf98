"""Walk a :class:`SplicePlan` against any :class:`SpliceBackend`: validate, splice or fall back, report.

Validation failures and refusals carry the stable :class:`FallbackCode`s. By default they fall
back to ``forget`` (the handle is released and the new sequence prefilled, which reuses the
common prefix and equals a fresh prefill) and the report says why; ``strict`` raises
:class:`SpliceError` instead. Runs on the engine's own thread (it calls the engine directly).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeVar

from leyline_sdk.core.directives import Directive, KeptRun, apply, check, digest
from leyline_sdk.core.errors import DirectiveError
from leyline_server.contract.base import SpliceBackend, StageT
from leyline_server.contract.report import FallbackCode, FallbackInfo, Refused, SpliceError, SpliceReport
from leyline_server.contract.values import CapacityError, Handle, ModelInfo, SpliceRequest
from leyline_server.splice.plan import Fill, SplicePlan, plan_splice

__all__ = ["splice", "splice_for_turn", "settle_forget", "validate", "CANARY_TOKENS"]

CANARY_TOKENS = 4
T = TypeVar("T")


def _resolve_blocks(directives: Sequence[Directive], blocks: Mapping[str, Handle]) -> list[Directive]:
    """Directives with each named block's tokens as the replacement (``Refused`` if unknown or different)."""
    out = []
    for i, d in enumerate(directives):
        if d.block is None:
            out.append(d)
            continue
        block = blocks.get(d.block)
        if block is None:
            raise Refused(FallbackCode.SPAN_INVALID, f"directive {i}: unknown block {d.block!r}")
        if d.replacement and tuple(d.replacement) != tuple(block.tokens):
            raise Refused(FallbackCode.SPAN_INVALID, f"directive {i}: replacement differs from block {d.block!r}")
        out.append(d if d.replacement else d.model_copy(update={"replacement": tuple(block.tokens)}))
    return out


def validate(info: ModelInfo, base: list[int], request: SpliceRequest) -> tuple[list[int], list[Directive]]:
    """(``apply(base, directives)``, the directives with blocks resolved), or :class:`Refused`."""
    if request.base_length is not None and request.base_length != len(base):
        raise Refused(FallbackCode.BASE_MISMATCH, f"client base length {request.base_length}, server has {len(base)}")
    if request.base_digest is not None and request.base_digest != digest(base):
        raise Refused(FallbackCode.BASE_MISMATCH, "client base digest differs from the server's")
    try:
        check(request.directives, len(base))
    except DirectiveError as exc:
        raise Refused(FallbackCode.SPAN_INVALID, str(exc)) from exc
    directives = _resolve_blocks(request.directives, request.blocks)
    for i, d in enumerate(directives):
        bad = [t for t in d.replacement if t >= info.vocab_size]
        if bad:
            raise Refused(FallbackCode.TOKEN_INVALID, f"directive {i}: token {bad[0]} >= vocab size {info.vocab_size}")
    new = apply(base, directives)
    if len(new) > info.max_context_tokens:  # the service refuses these before queuing; never allocate for one
        raise Refused(
            FallbackCode.CONTEXT_LENGTH, f"the result is {len(new)} tokens; the context holds {info.max_context_tokens}"
        )
    prompt = request.prompt
    if prompt is not None and list(prompt[: len(new)]) != new:
        raise Refused(FallbackCode.PROMPT_MISMATCH, "apply(base, directives) is not a prefix of the prompt")
    return new, directives


def _elapsed(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


class _Lease:
    """The caller's handle, released at most once (by the forget path, or on an unexpected error)."""

    def __init__(self, engine: SpliceBackend[Any], handle: Handle) -> None:
        self.engine, self.handle, self.released = engine, handle, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.engine.release(self.handle)


def _forget(
    engine: SpliceBackend[Any],
    lease: _Lease,
    new: Sequence[int],
    started: float,
    fallback: FallbackInfo | None,
    defer: bool = False,
) -> tuple[Handle | None, SpliceReport]:
    # Release first: the common prefix is re-matched and locked by the prefill, and the old
    # branch becomes evictable, so a forget fits where the splice (which must keep it) did not.
    scope = lease.handle.scope
    lease.release()
    if defer:  # the turn's own prefill (chunked) recomputes ``new``: see ``splice_for_turn``
        report = SpliceReport(applied=fallback is None, fallback=fallback, prefilled_tokens=len(new), deferred=True)
        return None, report.model_copy(update={"splice_ms": _elapsed(started)})
    result = engine.prefill(new, scope)
    report = SpliceReport(
        applied=fallback is None,
        fallback=fallback,
        reused_tokens=result.reused,
        prefilled_tokens=len(new) - result.reused,
        splice_ms=_elapsed(started),
    )
    return result.handle, report


def _check_moves(engine: SpliceBackend[Any], handle: Handle, plan: SplicePlan, blocks: Mapping[str, Handle]) -> None:
    info = engine.info
    if not info.shiftable and (any(run.shift for run in plan.moves) or plan.places):
        raise Refused(FallbackCode.ROPE_UNSUPPORTED, info.unshiftable_reason or "RoPE not shiftable")
    shifted = [p for run in plan.moves if run.shift for p in range(run.old_start, run.old_end)]
    counts = list(engine.rotation_counts(handle, shifted) or []) if shifted else []
    for place in plan.places:
        counts += engine.rotation_counts(blocks[place.block], range(place.start, place.end)) or []
    if counts and max(counts) + 1 > engine.rotation_budget:
        raise Refused(FallbackCode.DRIFT_BUDGET, f"a slot would pass its rotation budget of {engine.rotation_budget}")


def _canary_sample(plan: SplicePlan, base: Sequence[int]) -> tuple[list[int], list[int]]:
    """Up to ``CANARY_TOKENS`` (new position, token) pairs spread over the moved and placed rows."""
    old, new = plan.moved_positions()
    pairs = [(n, base[o]) for o, n in zip(old, new, strict=True)]
    for place in plan.places:
        pairs += [(place.at + i, t) for i, t in enumerate(place.tokens)]
    if not pairs:
        return [], []
    n = min(CANARY_TOKENS, len(pairs))
    picks = sorted({round(i * (len(pairs) - 1) / max(n - 1, 1)) for i in range(n)})
    return [pairs[i][0] for i in picks], [pairs[i][1] for i in picks]


def _walk(
    engine: SpliceBackend[StageT],
    stage: StageT,
    handle: Handle,
    plan: SplicePlan,
    blocks: Mapping[str, Handle],
    fill_chunk: int | None,
) -> Generator[None, None, str]:
    """Moves, then every step in order, then the canary; returns the canary's verdict.

    A fill longer than ``fill_chunk`` tokens is computed in chunks, yielding between them (a
    scheduler runs other work there; the stage stays private to this splice).
    """
    if plan.moves:
        engine.move(stage, handle, plan.moves)
    for step in plan.steps:
        if isinstance(step, Fill):
            size = fill_chunk or len(step.tokens) or 1
            for offset in range(0, len(step.tokens), size):
                if offset:
                    yield
                engine.fill(stage, step.at + offset, step.tokens[offset : offset + size])
        else:
            engine.move(stage, blocks[step.block], [KeptRun(step.start, step.end, step.at)])
    positions, tokens = _canary_sample(plan, handle.tokens)
    if not positions:
        return "skipped"
    result = engine.canary(stage, positions, tokens)
    if result.ran and result.error > result.tolerance:
        raise Refused(FallbackCode.CANARY_FAILED, f"layer-0 keys off by {result.error:.2e} (relative) after rotation")
    return "passed" if result.ran else "unavailable"


def _amortize(
    engine: SpliceBackend[StageT],
    handle: Handle,
    plan: SplicePlan,
    blocks: Mapping[str, Handle],
    started: float,
    fill_chunk: int | None = None,
) -> Generator[None, None, tuple[Handle, SpliceReport]]:
    _check_moves(engine, handle, plan, blocks)
    stage = engine.begin(handle, plan.keep)
    try:
        canary = yield from _walk(engine, stage, handle, plan, blocks, fill_chunk)
    except BaseException:
        engine.abort(stage)
        raise
    fresh = engine.commit(stage, plan.tokens, plan.exact, previous=handle)
    report = SpliceReport(
        applied=True,
        reused_tokens=plan.keep,
        rotated_tokens=plan.rotated_tokens,
        prefilled_tokens=plan.filled_tokens,
        canary=canary,  # type: ignore[arg-type]
        splice_ms=_elapsed(started),
    )
    return fresh, report


def splice_for_turn(
    engine: SpliceBackend[StageT], handle: Handle, request: SpliceRequest, fill_chunk: int | None = None
) -> Generator[None, None, tuple[Handle | None, SpliceReport]]:
    """:func:`splice` as the first half of a turn whose prefill follows (in chunks, on a scheduler),
    as a generator: it yields between chunks of ``fill_chunk`` replacement tokens, and returns
    what :func:`splice` returns. Closing it early aborts the splice and releases ``handle``.

    A forget (asked, or a fallback) computes nothing here: the handle is released and ``None``
    comes back, with ``prefilled_tokens`` holding the length of the sequence to recompute; the
    turn's prefill recomputes it from the cached prefix, and :func:`settle_forget` fills in the
    counts.
    """
    lease = _Lease(engine, handle)
    try:
        return (yield from _splice(engine, lease, request, time.perf_counter(), True, fill_chunk))
    except SpliceError:
        raise
    except BaseException:
        lease.release()
        raise


def settle_forget(report: SpliceReport, reused: int) -> SpliceReport:
    """A deferred forget's counts once the turn's prefill found ``reused`` tokens cached."""
    length = report.prefilled_tokens
    kept = min(reused, length)
    return report.model_copy(update={"reused_tokens": kept, "prefilled_tokens": length - kept, "deferred": False})


def splice(engine: SpliceBackend[StageT], handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
    """Apply ``request`` to the session cached as ``handle``; return the new handle and a report.

    ``handle`` is consumed unless :class:`SpliceError` is raised (strict mode: nothing changed);
    on any other exception it has been released. When the directives cannot even be applied to
    the base (``base_mismatch``, ``span_invalid``, ``token_invalid``) and the request carries no
    prompt, the same handle comes back with ``applied=False``; with a prompt, the fallback
    prefills the prompt.
    """
    lease = _Lease(engine, handle)
    try:
        spliced, report = _drain(_splice(engine, lease, request, time.perf_counter()))
        assert spliced is not None  # nothing deferred
        return spliced, report
    except SpliceError:
        raise
    except BaseException:
        lease.release()
        raise


def _drain(steps: Generator[None, None, T]) -> T:
    """Run a generator to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _splice(
    engine: SpliceBackend[StageT],
    lease: _Lease,
    request: SpliceRequest,
    started: float,
    defer: bool = False,
    fill_chunk: int | None = None,
) -> Generator[None, None, tuple[Handle | None, SpliceReport]]:
    handle = lease.handle
    new: list[int] | None = None
    try:
        new, directives = validate(engine.info, handle.tokens, request)
        plan = plan_splice(handle.tokens, directives, handle.cached, exact=handle.exact)
        if plan.is_reprefill:
            return _forget(engine, lease, new, started, None, defer)
        return (yield from _amortize(engine, handle, plan, request.blocks, started, fill_chunk))
    except (Refused, CapacityError) as exc:
        code, message = (exc.code, exc.message) if isinstance(exc, Refused) else (FallbackCode.CAPACITY, str(exc))
        if request.strict:
            raise SpliceError(code, message) from exc
        fallback = FallbackInfo(code=code, message=message)
        target = new if new is not None else (list(request.prompt) if request.prompt is not None else None)
        if target is None:
            return handle, SpliceReport(applied=False, fallback=fallback, splice_ms=_elapsed(started))
        return _forget(engine, lease, target, started, fallback, defer)
