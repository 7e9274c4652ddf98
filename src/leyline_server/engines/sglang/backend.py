"""The splice backend of the SGLang engine: :class:`SpliceBackend` over control requests and SGLang requests.

Runs in the main process, on a worker thread (it blocks on round trips to the scheduler); the
:mod:`~leyline_server.splice.execute` executor walks a plan against it exactly as against the
embedded engine. Everything that touches KV happens in the scheduler (:mod:`.splicer`), reached
through a :class:`Transport`: ``control`` sends one control request and returns the rank-0 reply,
``prefill`` runs one SGLang request (the cached prefix is reused, the rest computed by SGLang's
batched prefill and inserted into its tree when the request finishes).

Index layout of a commit (the plan's steps, run left to right — a trie path must exist up to
``at`` before anything is inserted after it)::

    new:  | keep          | R_1        | run_1 moved          | R_2        | ... | tail       |
            handle's path   request      control "extend"       request            request
            (pinned)        new[:end]    (alloc+rotate+insert)  new[:end]          new[:len]

Between steps nothing is locked but the previous handle: if SGLang evicts a fresh step before the
next one extends it, the step is recomputed once, then the splice falls back (``capacity``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from leyline_sdk.core.directives import KeptRun
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.contract.values import CacheScope, CanaryResult, CapacityError, Handle, ModelInfo, Prefilled
from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET

__all__ = ["ControlError", "SGLangHandle", "SGLangSpliceBackend", "Transport", "namespace"]


def namespace(scope: CacheScope) -> str | None:
    """The SGLang ``cache_salt`` of ``scope``: the session's own namespace, else the salt (shared).

    SGLang namespaces are per key from the root, so a session's whole history lives in its own
    namespace from its first request (no prefix sharing across sessions); requests without a
    session share exact KV per salt, as on the embedded engine.
    """
    if scope.private is None:
        return scope.salt
    return f"leyline:{scope.salt or ''}:{scope.private}"


class ControlError(RuntimeError):
    """The scheduler refused a control request (``code`` says why)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Transport(Protocol):
    """How the backend reaches SGLang (IPC in production, direct calls in the CPU tests)."""

    def control(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Send one control request to every scheduler rank; rank 0's reply (raises ControlError)."""
        ...

    def post(self, op: str, args: dict[str, Any]) -> None:
        """Send a control request without waiting for its reply (releases)."""
        ...

    def prefill(self, tokens: list[int], ns: str | None) -> int:
        """Run ``tokens`` through SGLang in namespace ``ns``; return how many were reused from its cache."""
        ...


@dataclass
class SGLangHandle(Handle):
    """A handle whose first ``cached`` tokens are locked in the schedulers' trees under ``pin``."""

    pin: int | None = None
    ns: str | None = None


@dataclass
class _Stage:
    """A splice being recorded: the handle, what it keeps, its moves and fills (nothing allocated).

    Each move keeps its source: the session's own handle for kept runs, a block's handle for a
    placed block (its rows are the block's, not the session's).
    """

    handle: SGLangHandle
    keep: int
    runs: list[tuple[SGLangHandle, KeptRun]] = field(default_factory=list)
    fills: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    def source_of(self, position: int) -> tuple[SGLangHandle, int]:
        """The handle and old position of the row a move puts at new ``position``."""
        for source, run in self.runs:
            if run.new_start <= position < run.new_start + run.old_end - run.old_start:
                return source, run.old_start + position - run.new_start
        raise ValueError(f"no move puts a row at position {position}")


@dataclass
class _Move:
    """Adjacent runs of one source, copy-rotated by one control request."""

    source: SGLangHandle
    runs: list[KeptRun]

    def __len__(self) -> int:
        return sum(r.old_end - r.old_start for r in self.runs)


def _steps(stage: _Stage) -> list[tuple[int, tuple[int, ...] | _Move]]:
    """The stage's steps in new-position order: ``(at, tokens)`` to fill or ``(at, _Move)``."""
    items: list[tuple[int, tuple[int, ...] | _Move]] = list(stage.fills)
    items += [(run.new_start, _Move(source, [run])) for source, run in stage.runs]
    items.sort(key=lambda item: item[0])
    merged: list[tuple[int, tuple[int, ...] | _Move]] = []
    for at, step in items:
        prev = merged[-1][1] if merged else None
        if isinstance(step, _Move) and isinstance(prev, _Move) and prev.source is step.source:
            last = prev.runs[-1]
            if last.new_start + last.old_end - last.old_start == at:  # adjacent runs: one request
                prev.runs.append(step.runs[0])
                continue
        merged.append((at, step))
    return merged


class SGLangSpliceBackend:
    """:class:`~leyline_server.contract.base.SpliceBackend` over SGLang (see the module docstring).

    ``rotation_budget``: how often one slot's key may be rotated before splices touching it are
    refused (``drift_budget``), as on the embedded engine. Thread-safe: each call is independent.
    """

    def __init__(
        self,
        transport: Transport,
        info: ModelInfo,
        rotation_budget: int = DEFAULT_ROTATION_BUDGET,
        canary_tolerance: float | None = None,
    ) -> None:
        self.transport = transport
        self._info = info
        self.rotation_budget = rotation_budget
        self.canary_tolerance = canary_tolerance
        self._pins = itertools.count(1)

    @property
    def info(self) -> ModelInfo:
        """The served model."""
        return self._info

    # -- handles ------------------------------------------------------------------------------------
    def pin(self, tokens: Sequence[int], scope: CacheScope) -> SGLangHandle:
        """Lock the longest cached prefix of ``tokens`` in ``scope``'s namespace as a handle."""
        ns = namespace(scope)
        pin = next(self._pins)
        reply = self.transport.control("pin", {"pin": pin, "tokens": list(tokens), "ns": ns})
        return SGLangHandle(list(tokens), int(reply["cached"]), int(reply["exact"]), scope, pin, ns)

    def release(self, handle: Handle) -> None:
        """Unlock a handle's path (it becomes evictable); does not wait for the scheduler."""
        pin = SGLangHandle.of(handle).pin
        if pin is not None:
            self.transport.post("unpin", {"pin": pin})

    def _check_room(self, tokens: list[int], ns: str | None, need: int | None = None, max_new: int = 1) -> None:
        """Raise :class:`CapacityError` unless SGLang would admit a request for ``tokens`` that
        generates ``max_new`` tokens (``need``: slots asked for instead, e.g. a whole commit)."""
        reply = self.transport.control("probe", {"tokens": tokens, "ns": ns, "max_new": max_new})
        need = int(reply["need"]) if need is None else need + max_new + 1
        if need > int(reply["room"]):
            raise CapacityError(f"need {need} KV slots, {reply['room']} free or evictable")

    def check_decode_room(self, tokens: Sequence[int], ns: str | None, max_new: int) -> None:
        """Before a generation of ``max_new`` tokens after ``tokens``: SGLang admits it only with
        room for all of them up front, and would otherwise queue it for as long as pinned
        sessions hold the pool (:class:`CapacityError` instead)."""
        self._check_room(list(tokens), ns, max_new=max_new)

    def prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled:
        """Cache ``tokens`` through SGLang (reusing its cached prefix) and pin them; release ``previous``."""
        tokens = list(tokens)
        if not tokens:
            if previous is not None:
                self.release(previous)
            return Prefilled(SGLangHandle([], 0, 0, scope, None, namespace(scope)), 0, 0, None)
        ns = namespace(scope)
        self._check_room(tokens, ns)
        reused = self.transport.prefill(tokens, ns)
        handle = self.pin(tokens, scope)
        if previous is not None:
            self.release(previous)
        return Prefilled(handle, reused, max(0, reused - min(handle.exact, reused)), None)

    # -- splice stages --------------------------------------------------------------------------------
    def rotation_counts(self, handle: Handle, positions: Sequence[int]) -> list[int] | None:
        """How often the keys at ``positions`` of ``handle`` were rotated already."""
        reply = self.transport.control("counts", {"pin": SGLangHandle.of(handle).pin, "positions": list(positions)})
        return [int(c) for c in reply["counts"]]

    def begin(self, handle: Handle, keep: int) -> _Stage:
        """Start recording a splice that keeps the first ``keep`` tokens of ``handle``."""
        return _Stage(SGLangHandle.of(handle), keep)

    def move(self, stage: _Stage, handle: Handle, runs: Sequence[KeptRun]) -> None:
        """Record ``runs`` of ``handle`` to copy-rotate (done in :meth:`commit`, in position order)."""
        source = SGLangHandle.of(handle)
        stage.runs.extend((source, run) for run in runs)

    def fill(self, stage: _Stage, at: int, tokens: Sequence[int]) -> None:
        """Record ``tokens`` to compute at ``[at, ...)`` (an SGLang request in :meth:`commit`)."""
        stage.fills.append((at, tuple(tokens)))

    def canary(self, stage: _Stage, positions: Sequence[int], tokens: Sequence[int]) -> CanaryResult:
        """Rotate the layer-0 rows the moves will put at ``positions`` (each read from its own source,
        rotated with the move's kernel) and compare them with the model's own layer-0 keys of
        ``tokens`` there (see :mod:`.splicer`)."""
        sources = [stage.source_of(p) for p in positions]
        args = {"sources": [[h.pin, old] for h, old in sources], "new": list(positions), "tokens": list(tokens)}
        if self.canary_tolerance is not None:
            args["tolerance"] = self.canary_tolerance
        reply = self.transport.control("canary", args)
        return CanaryResult(bool(reply["ran"]), float(reply["error"]), float(reply["tolerance"]))

    def abort(self, stage: _Stage) -> None:
        """Nothing was allocated before :meth:`commit`: forget the recorded steps."""
        stage.runs.clear()
        stage.fills.clear()

    def _extend(self, stage: _Stage, tokens: list[int], at: int, move: _Move) -> None:
        args = {
            "pin": move.source.pin,
            "ns": stage.handle.ns,
            "prefix": tokens[:at],
            "runs": [[r.old_start, r.old_end, r.new_start] for r in move.runs],
            "tokens": tokens[at : at + len(move)],
        }
        for attempt in range(2):
            try:
                self.transport.control("extend", args)
                return
            except ControlError as exc:
                if exc.code == FallbackCode.CAPACITY.value:
                    raise CapacityError(str(exc)) from exc
                if exc.code != "missing_prefix" or attempt:
                    raise CapacityError(f"the splice's prefix was evicted before it could be extended: {exc}") from exc
                self.transport.prefill(tokens[:at], stage.handle.ns)  # evicted meanwhile: recompute it once

    def commit(self, stage: _Stage, tokens: Sequence[int], exact: int, previous: Handle) -> SGLangHandle:
        """Run the recorded steps left to right, pin the new sequence and release ``previous``.

        Raises :class:`CapacityError` (the executor falls back to ``forget``) when SGLang cannot
        hold the new sequence; what was inserted so far stays in the tree as evictable cache.
        """
        tokens = list(tokens)
        handle = SGLangHandle.of(previous)
        self._check_room(tokens, handle.ns, need=len(tokens) - stage.keep)
        done = stage.keep
        for at, step in _steps(stage):
            if at != done:
                raise AssertionError(f"splice step at {at} after {done} staged tokens")
            if isinstance(step, _Move):
                self._extend(stage, tokens, at, step)
            else:
                self.transport.prefill(tokens[: at + len(step)], handle.ns)
            done = at + len(step)
        fresh = self.pin(tokens, handle.scope)
        fresh.exact = min(fresh.exact, exact)
        self.release(previous)
        return fresh
