"""Walk a :class:`SplicePlan` against any :class:`SpliceBackend`: validate, splice or fall back, report.

Validation failures and refusals carry the stable :class:`FallbackCode`s. By default they fall
back to ``forget`` (the handle is released and the new sequence prefilled, which reuses the
common prefix and equals a fresh prefill) and the report says why; ``strict`` raises
:class:`SpliceError` instead. Runs on the engine's own thread (it calls the engine directly).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from leyline_sdk.directives import apply, check, digest
from leyline_sdk.errors import DirectiveError
from leyline_server.engines.base import CapacityError, Handle, ModelInfo, SpliceBackend, SpliceRequest
from leyline_server.splice.plan import SplicePlan, plan_splice
from leyline_server.splice.report import Fallback, FallbackCode, Refused, SpliceError, SpliceReport

__all__ = ["splice", "validate", "CANARY_TOKENS"]

CANARY_TOKENS = 4


def validate(info: ModelInfo, base: list[int], request: SpliceRequest) -> list[int]:
    """``apply(base, directives)``, or :class:`Refused` with the code of the first problem."""
    if request.base_length is not None and request.base_length != len(base):
        raise Refused(FallbackCode.BASE_MISMATCH, f"client base length {request.base_length}, server has {len(base)}")
    if request.base_digest is not None and request.base_digest != digest(base):
        raise Refused(FallbackCode.BASE_MISMATCH, "client base digest differs from the server's")
    try:
        check(request.directives, len(base))
    except DirectiveError as exc:
        raise Refused(FallbackCode.SPAN_INVALID, str(exc)) from exc
    for i, d in enumerate(request.directives):
        bad = [t for t in d.replacement if t >= info.vocab_size]
        if bad:
            raise Refused(FallbackCode.TOKEN_INVALID, f"directive {i}: token {bad[0]} >= vocab size {info.vocab_size}")
    new = apply(base, request.directives)
    prompt = request.prompt
    if prompt is not None and list(prompt[: len(new)]) != new:
        raise Refused(FallbackCode.PROMPT_MISMATCH, "apply(base, directives) is not a prefix of the prompt")
    return new


def _elapsed(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


class _Lease:
    """The caller's handle, released at most once (by the forget path, or on an unexpected error)."""

    def __init__(self, engine: SpliceBackend, handle: Handle) -> None:
        self.engine, self.handle, self.released = engine, handle, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.engine.release(self.handle)


def _forget(
    engine: SpliceBackend, lease: _Lease, new: Sequence[int], started: float, fallback: Fallback | None
) -> tuple[Handle, SpliceReport]:
    # Release first: the common prefix is re-matched and locked by the prefill, and the old
    # branch becomes evictable, so a forget fits where the splice (which must keep it) did not.
    scope = lease.handle.scope
    lease.release()
    result = engine.prefill(new, scope)
    report = SpliceReport(
        applied=fallback is None,
        fallback=fallback,
        reused_tokens=result.reused,
        prefilled_tokens=len(new) - result.reused,
        splice_ms=_elapsed(started),
    )
    return result.handle, report


def _check_moves(engine: SpliceBackend, handle: Handle, plan: SplicePlan) -> None:
    info = engine.info
    if not info.shiftable and any(run.shift for run in plan.moves):
        raise Refused(FallbackCode.ROPE_UNSUPPORTED, info.unshiftable_reason or "RoPE not shiftable")
    shifted = [p for run in plan.moves if run.shift for p in range(run.old_start, run.old_end)]
    counts = engine.rotation_counts(handle, shifted) if shifted else None
    if counts and max(counts) + 1 > engine.rotation_budget:
        raise Refused(FallbackCode.DRIFT_BUDGET, f"a slot would pass its rotation budget of {engine.rotation_budget}")


def _canary_sample(plan: SplicePlan, base: Sequence[int]) -> tuple[list[int], list[int]]:
    old, new = plan.moved_positions()
    if not old:
        return [], []
    n = min(CANARY_TOKENS, len(old))
    picks = sorted({round(i * (len(old) - 1) / max(n - 1, 1)) for i in range(n)})
    return [new[i] for i in picks], [base[old[i]] for i in picks]


def _amortize(engine: SpliceBackend, handle: Handle, plan: SplicePlan, started: float) -> tuple[Handle, SpliceReport]:
    _check_moves(engine, handle, plan)
    stage = engine.begin(handle, plan.keep)
    canary = "skipped"
    try:
        if plan.moves:
            engine.move(stage, handle, plan.moves)
            positions, tokens = _canary_sample(plan, handle.tokens)
            result = engine.canary(stage, positions, tokens)
            if result.ran and result.error > result.tolerance:
                raise Refused(
                    FallbackCode.CANARY_FAILED, f"layer-0 keys off by {result.error:.2e} (relative) after rotation"
                )
            canary = "passed" if result.ran else "unavailable"
        for fill in plan.fills:
            engine.fill(stage, fill.at, fill.tokens)
        if plan.tail:
            engine.fill(stage, plan.cut, plan.tail)
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


def splice(engine: SpliceBackend, handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
    """Apply ``request`` to the session cached as ``handle``; return the new handle and a report.

    ``handle`` is consumed unless :class:`SpliceError` is raised (strict mode: nothing changed);
    on any other exception it has been released. When the directives cannot even be applied to
    the base (``base_mismatch``, ``span_invalid``, ``token_invalid``) and the request carries no
    prompt, the same handle comes back with ``applied=False``; with a prompt, the fallback
    prefills the prompt.
    """
    lease = _Lease(engine, handle)
    try:
        return _splice(engine, lease, request, time.perf_counter())
    except SpliceError:
        raise
    except BaseException:
        lease.release()
        raise


def _splice(
    engine: SpliceBackend, lease: _Lease, request: SpliceRequest, started: float
) -> tuple[Handle, SpliceReport]:
    handle = lease.handle
    new: list[int] | None = None
    try:
        new = validate(engine.info, handle.tokens, request)
        plan = plan_splice(handle.tokens, request.directives, handle.cached, exact=handle.exact)
        if plan.is_reprefill:
            return _forget(engine, lease, new, started, None)
        return _amortize(engine, handle, plan, started)
    except (Refused, CapacityError) as exc:
        code, message = (exc.code, exc.message) if isinstance(exc, Refused) else (FallbackCode.CAPACITY, str(exc))
        if request.strict:
            raise SpliceError(code, message) from exc
        fallback = Fallback(code=code, message=message)
        target = new if new is not None else (list(request.prompt) if request.prompt is not None else None)
        if target is None:
            return handle, SpliceReport(applied=False, fallback=fallback, splice_ms=_elapsed(started))
        return _forget(engine, lease, target, started, fallback)
