"""Embedded engine core: slot pool + radix prefix cache + transformers forward (synchronous).

Everything here runs on one thread (:class:`~leyline_server.engines.embedded.serving.AsyncEmbeddedEngine`
owns that thread). It implements :class:`~leyline_server.contract.base.SpliceBackend`:

* ``prefill`` — cache a sequence reusing the longest prefix cached in its scope;
* ``begin`` / ``move`` / ``fill`` / ``canary`` / ``commit`` / ``abort`` — the splice stages,
  over a growing slot list (``-1`` marks a position not staged yet);
* ``decode`` — greedy or sampled decoding, one token per ``next()``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from leyline_sdk.core.directives import KeptRun
from leyline_server.contract.jobs import Chunk, DecodeJob, PrefillJob, StepFailures
from leyline_server.contract.logits import Processors
from leyline_server.contract.values import (
    SHARED,
    CacheScope,
    CanaryResult,
    CapacityError,
    GenerationStep,
    Handle,
    ModelInfo,
    Prefilled,
    SamplingParams,
)
from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET, context_window
from leyline_server.engines.config import canary_tolerance as canary_tolerance_of
from leyline_server.engines.embedded import batch
from leyline_server.engines.embedded.batch import Pinned, SlotDecode, SlotPrefill
from leyline_server.engines.embedded.cache_adapter import check_layer_types, forward_with_slots, layer0_keys
from leyline_server.engines.embedded.mirror import MirrorStore
from leyline_server.engines.embedded.pool import SlotPool
from leyline_server.engines.embedded.radix import RadixCache
from leyline_server.engines.stepping import decode_steps, prefill_whole
from leyline_server.kernels import Backend, rotate_copy
from leyline_server.rope import RopeSpec

__all__ = ["EmbeddedEngine", "Pinned", "SlotStage"]


@dataclass
class SlotStage:
    """A sequence under construction: its slots so far (``-1``: not staged) and what it allocated."""

    slots: torch.Tensor
    allocated: list[torch.Tensor] = field(default_factory=list)

    def grow(self, n: int) -> None:
        if n > self.slots.numel():
            pad = torch.full((n - self.slots.numel(),), -1, dtype=torch.int64)
            self.slots = torch.cat([self.slots, pad])


class EmbeddedEngine:
    """One model, one slot pool, one radix cache. Not thread-safe: use from one thread.

    ``rotation_budget``: how often one slot's key may be rotated before splices touching it are
    refused (``drift_budget``); ``canary_tolerance``: the canary's largest relative layer-0 key
    error (default: by the pool's dtype). ``rotate_backend``: what :func:`~leyline_server.kernels.rotate_copy`
    runs (``"auto"``; ``"torch"`` is the plain reference, for tests and benchmarks).
    ``prefix_cache=False`` makes every prefill start from scratch (a baseline for benchmarks);
    handles and splices work as usual. ``max_context_tokens`` larger than the model's positions
    or the pool is refused (``ValueError``, :func:`~leyline_server.engines.config.context_window`).
    """

    def __init__(
        self,
        model: Any,
        pool: SlotPool,
        spec: RopeSpec,
        eos_token_ids: Sequence[int] = (),
        rotation_budget: int = DEFAULT_ROTATION_BUDGET,
        canary_tolerance: float | None = None,
        name: str = "model",
        max_context_tokens: int | None = None,
        prefix_cache: bool = True,
    ) -> None:
        self.model = model
        self.pool = pool
        self.spec = spec
        self.radix = RadixCache()
        self.in_flight: set[int] = set()
        self.rotation_budget = rotation_budget
        self.canary_tolerance = canary_tolerance_of("torch", str(pool.dtype), canary_tolerance)
        self.rotate_backend: Backend = "auto"
        self.prefix_cache = prefix_cache
        check_layer_types(model.config)
        self.mirrors = MirrorStore(pool, max_mirrors=8)
        positions = int(getattr(model.config, "max_position_embeddings", 32_768) or 32_768)
        self._info = ModelInfo(
            name=name,
            vocab_size=int(model.config.vocab_size),
            eos_token_ids=tuple(eos_token_ids),
            max_context_tokens=context_window(
                max_context_tokens, positions, pool.capacity, pool.layout.bytes_per_slot(pool.dtype)
            ),
            kv_capacity_tokens=pool.capacity,
            shiftable=spec.shiftable,
            unshiftable_reason=spec.reason,
            engine="embedded",
            retracts=True,
        )

    @property
    def info(self) -> ModelInfo:
        """What the service needs to know about the model."""
        return self._info

    # -- slots ----------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor:
        """``n`` fresh slots (evicting unlocked cache if needed); ``CapacityError`` if impossible."""
        if self.pool.available < n:
            self.pool.free(self.radix.evict(n - self.pool.available))
        slots = self.pool.alloc(n)
        if slots is None:
            raise CapacityError(f"need {n} KV slots, {self.pool.available} free of {self.pool.capacity}")
        self.in_flight.update(slots.tolist())
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Give back slots this engine handed out and that no node took."""
        self.in_flight.difference_update(slots.tolist())
        self.pool.free(slots)

    def extend(
        self, context: torch.Tensor, tokens: Sequence[int], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV for ``tokens`` at ``positions`` after ``context``: (new slots, the last token's logits ``[1, V]``)."""
        slots = self.alloc(len(tokens))
        try:
            logits = forward_with_slots(self.model, self.pool, self.mirrors, context, list(tokens), positions, slots)
        except BaseException:
            self.free(slots)
            raise
        return slots, logits

    # -- radix ----------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], scope: CacheScope = SHARED) -> Pinned:
        """The prefix of ``tokens`` cached in ``scope``, locked."""
        m = self.radix.match_prefix(tokens, scope)
        self.radix.lock(m.node)
        return Pinned(list(tokens), m.length, m.exact, scope, m.slots, m.node)

    def _commit(
        self, tokens: Sequence[int], slots: torch.Tensor, scope: CacheScope, exact: int, previous: Handle | None
    ) -> Pinned:
        """Insert ``tokens[:len(slots)] -> slots`` (now owned by the tree), lock it, release ``previous``."""
        n = len(slots)
        exact = min(exact, n)
        result = self.radix.insert(list(tokens[:n]), slots, scope, exact)
        self.in_flight.difference_update(slots.tolist())
        if result.duplicate_slots.numel():
            self.pool.free(result.duplicate_slots)
        self.radix.lock(result.node)
        if previous is not None:
            self.release(previous)
        return Pinned(list(tokens), n, exact, scope, self.radix.path_slots(result.node), result.node)

    def release(self, handle: Handle) -> None:
        """Unlock a handle's path (it becomes evictable)."""
        node = Pinned.of(handle).node
        if node is not None:
            self.radix.unlock(node)

    def close(self) -> None:
        """Drop the mirrors (the pool and the model go with the engine object)."""
        self.mirrors.clear()

    def check_integrity(self) -> None:
        """Every slot free, owned by one node, or in flight — exactly once (tests call this)."""
        self.radix.check_integrity(self.pool.capacity, self.pool.free_slots(), self.in_flight)

    # -- prefill and decode (one sequence: engines.stepping; batched steps: embedded.batch) -----------
    def prefill(self, tokens: Sequence[int], scope: CacheScope = SHARED, previous: Handle | None = None) -> Prefilled:
        """Cache ``tokens`` reusing the longest prefix cached in ``scope``; ``last_logits`` set.

        At least the last token is computed, so its logits are fresh. An empty sequence gives an
        empty handle (``last_logits`` is ``None``).
        """
        if not tokens:
            hit = self.match([], scope)
            if previous is not None:
                self.release(previous)
            return Prefilled(hit, 0, 0, None)
        return prefill_whole(self, tokens, scope, previous)

    def decode(
        self,
        handle: Handle,
        last_logits: torch.Tensor,
        params: SamplingParams,
        delivered: Callable[[], int] | None = None,
        processors: Processors | None = None,
    ) -> Generator[GenerationStep, None, None]:
        """Yield decoded tokens after ``handle`` (``last_logits``: its prefill's), one forward each.

        ``processors`` change each logits row before sampling (constraints, ``min_tokens``); a
        finished one (a complete grammar) ends generation with ``stop``. When the generator ends or
        is closed, the first ``delivered()`` generated tokens (all of them without ``delivered``)
        are committed to the cache (KV for all but the last) and ``handle`` is updated in place.
        """
        return decode_steps(self, handle, last_logits, params, delivered, processors)

    def start_prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> SlotPrefill:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        return batch.start_prefill(self, tokens, scope, previous)

    def forward(self, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> StepFailures:
        """One packed forward over every chunk and decode token (:mod:`.packed`)."""
        return batch.forward(self, chunks, decodes)

    def finish_prefill(self, job: PrefillJob) -> Prefilled:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        return batch.finish_prefill(self, job)

    def abort_prefill(self, job: PrefillJob) -> None:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        batch.abort_prefill(self, job)

    def start_decode(
        self, handle: Handle, last_logits: torch.Tensor, params: SamplingParams, processors: Processors | None = None
    ) -> SlotDecode:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        return batch.start_decode(self, handle, last_logits, params, processors)

    def sample(self, job: DecodeJob) -> GenerationStep:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        return batch.sample(self, job)

    def finish_decode(self, job: DecodeJob, delivered: int) -> None:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        batch.finish_decode(self, job, delivered)

    def retract_decode(self, job: DecodeJob) -> None:
        """See :class:`~leyline_server.contract.base.SyncCore` (its KV becomes evictable cache)."""
        batch.retract_decode(self, job)

    def resume_decode(self, job: DecodeJob, prefilled: Prefilled) -> None:
        """See :class:`~leyline_server.contract.base.SyncCore`."""
        batch.resume_decode(self, job, prefilled)

    # -- splice stages (SpliceBackend) ------------------------------------------------------------
    def rotation_counts(self, handle: Handle, positions: Sequence[int]) -> list[int] | None:
        """How often the keys at ``positions`` of ``handle`` were rotated already."""
        slots = Pinned.of(handle).slots[torch.as_tensor(list(positions), dtype=torch.long)]
        return [int(x) for x in self.pool.rotations[slots].tolist()]

    def begin(self, handle: Handle, keep: int) -> SlotStage:
        """A stage that keeps the first ``keep`` cached tokens of ``handle`` where they are."""
        return SlotStage(Pinned.of(handle).slots[:keep].clone())

    def move(self, stage: SlotStage, handle: Handle, runs: Sequence[KeptRun]) -> None:
        """Copy-rotate ``runs`` of ``handle`` into fresh slots at their new positions (one kernel call)."""
        pinned = Pinned.of(handle)
        old = torch.cat([torch.arange(r.old_start, r.old_end) for r in runs])
        new = torch.cat([torch.arange(r.new_start, r.new_start + r.old_end - r.old_start) for r in runs])
        src = pinned.slots[old]
        dst = self.alloc(src.numel())
        stage.allocated.append(dst)
        rotate_copy(self.pool.keys, src, dst, old, new, self.spec, values=self.pool.values, backend=self.rotate_backend)
        self.pool.rotations[dst] = self.pool.rotations[src] + (new != old).int()
        stage.grow(int(new.max()) + 1)
        stage.slots[new] = dst

    def fill(self, stage: SlotStage, at: int, tokens: Sequence[int]) -> None:
        """Compute ``tokens`` at positions ``[at, ...)`` attending to the staged ``[0, at)``."""
        context = stage.slots[:at]
        if context.numel() != at or bool((context < 0).any()):
            raise AssertionError(f"fill at {at} over a hole in the staged sequence")
        slots, _ = self.extend(context, tokens, torch.arange(at, at + len(tokens)))
        stage.allocated.append(slots)
        stage.grow(at + len(tokens))
        stage.slots[at : at + len(tokens)] = slots

    def canary(self, stage: SlotStage, positions: Sequence[int], tokens: Sequence[int]) -> CanaryResult:
        """Compare staged layer-0 keys at ``positions`` with the model's own keys for ``tokens``."""
        if not positions:
            return CanaryResult(False)
        pos = torch.as_tensor(list(positions), dtype=torch.long)
        expected = layer0_keys(self.model, list(tokens), pos, self.pool.layout.mla_latent)
        actual = self.pool.keys[0].index_select(0, stage.slots[pos]).float()
        error = (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)
        return CanaryResult(True, error, self.canary_tolerance)

    def commit(self, stage: SlotStage, tokens: Sequence[int], exact: int, previous: Handle) -> Pinned:
        """Cache the staged sequence as ``tokens`` under ``previous``'s scope and release ``previous``."""
        n = min(len(tokens), stage.slots.numel())
        slots = stage.slots[:n]
        try:
            if bool((slots < 0).any()):
                raise AssertionError("commit over a hole in the staged sequence")
            return self._commit(tokens, slots, previous.scope, exact, previous)
        except BaseException:
            self.abort(stage)  # the slots were not taken by the tree: give them back
            raise

    def abort(self, stage: SlotStage) -> None:
        """Give back every slot the stage allocated."""
        for slots in stage.allocated:
            self.free(slots)
        stage.allocated.clear()
