"""The llama.cpp engine core: sequences of one unified KV pool as cache entries (synchronous).

Everything here runs on one thread (:class:`~leyline_server.engines.llamacpp.serving.AsyncLlamaCppEngine`
owns it). It implements :class:`~leyline_server.contract.base.SpliceBackend`:

* ``prefill`` — reuse the longest visible prefix of any entry (``seq_cp``: shared cells), or
  take over the caller's previous sequence, and decode the rest;
* the splice stages work **in place** on the session's own sequence (llama.cpp cannot copy
  cells cheaply, but it can move them): ``begin`` makes the cells past ``keep`` private
  (:meth:`SequenceCache.unshare_after`); the first ``move`` removes every base token the plan
  drops and moves the kept runs with ``llama_memory_seq_add`` (keys are re-rotated by llama.cpp
  itself, lazily, at the next decode); each ``fill`` decodes its tokens in a scratch sequence that
  holds only the staged prefix ``[0, at)`` and hands the new cells over; a block (``Place``) is
  copied through the state API and moved; ``commit`` re-describes the sequence; ``abort`` cuts it
  back to ``keep`` (the old handle then re-prefills its tail when used again);
* ``canary`` reads rotated layer-0 keys back through the state API and compares them with the
  keys of the same tokens decoded alone at the same positions (layer-0 keys depend on nothing else),
  computed by a small second context that stops after layer 0 (:mod:`.canary`);
* batched steps (:class:`~leyline_server.contract.base.SyncCore`, :mod:`.batch`): prefill chunks
  and decode tokens of many sequences in one ``llama_decode``, each stream sampled by its own
  chain from its row in place; ``prefill`` and ``decode`` drive them for one sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import numpy as np

from leyline_sdk.core.directives import KeptRun
from leyline_server.contract.jobs import Chunk, DecodeJob, PrefillJob, StepFailures
from leyline_server.contract.logits import Processors
from leyline_server.contract.values import (
    SHARED,
    CacheScope,
    CanaryResult,
    GenerationStep,
    Handle,
    Logits,
    ModelInfo,
    Prefilled,
    SamplingParams,
)
from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET, context_window
from leyline_server.engines.config import canary_tolerance as canary_tolerance_of
from leyline_server.engines.llamacpp import batch
from leyline_server.engines.llamacpp.batch import SeqDecode, SeqPrefill, finish_decode, forward, sample, start_decode
from leyline_server.engines.llamacpp.cache import Entry, SequenceCache
from leyline_server.engines.llamacpp.canary import run_canary, verified_probe
from leyline_server.engines.llamacpp.lib import ContextConfig, LlamaContext, LlamaModel, default_threads
from leyline_server.engines.llamacpp.parking import ParkingPolicy, focus
from leyline_server.engines.llamacpp.shift import unshiftable_reason, verified_shifter
from leyline_server.engines.llamacpp.stage import Stage, land, move_block, prepare
from leyline_server.engines.stepping import decode_steps, prefill_whole

__all__ = ["LlamaCppEngine", "SeqHandle", "SCRATCH", "COPY", "CANARY_SEQS"]
SCRATCH, COPY = 0, 1  # reserved sequence ids: fills, copies and read-backs
CANARY_SEQS = (2, 3, 4, 5)  # one empty sequence per canary token (reference keys)
_RESERVED = 2 + len(CANARY_SEQS)


@dataclass
class SeqHandle(Handle):
    """A handle whose cached tokens are the llama.cpp sequence of ``entry`` (``None`` once released)."""

    entry: Entry | None = None


def _entry(handle: Handle) -> Entry | None:
    return SeqHandle.of(handle).entry


def _own(entry: Entry, scope: CacheScope) -> bool:
    """Whether ``entry`` was cached by the session ``scope`` belongs to."""
    return scope.private is not None and entry.scope == scope


class LlamaCppEngine:
    """One GGUF model, one unified KV pool, its sequences as cache. Not thread-safe: use one thread.

    ``rotation_budget``: how often one cell's key may be rotated before splices touching it are
    refused (``drift_budget``); ``canary_tolerance``: the largest relative layer-0 key error a
    splice may show (default: by KV dtype). ``prefix_cache=False``: every prefill starts from scratch.
    ``park_budget``: bytes of host memory for the KV of idle sequences parked out of the pool
    (0: never park; see :mod:`.parking`), ``park_threshold``: the decode slowdown idle sequences
    may cause before they are parked. ``max_context_tokens`` larger than the model's trained
    context or the pool is refused (``ValueError``, naming ``--kv-budget-mb``).
    """

    def __init__(
        self,
        model: LlamaModel,
        n_ctx: int,
        kv_type: str = "float16",
        flash_attn: bool | None = False,
        n_seq_max: int = 256,
        threads: tuple[int, int] | None = None,
        eos_token_ids: Sequence[int] | None = None,
        rotation_budget: int = DEFAULT_ROTATION_BUDGET,
        canary_tolerance: float | None = None,
        name: str = "model",
        max_context_tokens: int | None = None,
        prefix_cache: bool = True,
        park_budget: int = 4 << 30,
        park_threshold: float = 0.05,
    ) -> None:
        context = context_window(max_context_tokens, model.n_ctx_train, n_ctx, model.cell_bytes(kv_type), granule=256)
        n_threads, n_threads_batch = threads or default_threads()
        config = ContextConfig(n_ctx, n_seq_max, 512, n_threads, n_threads_batch, kv_type, flash_attn)
        self.model = model
        self.ctx = LlamaContext(model, config)
        self.cache = SequenceCache(self.ctx, _RESERVED, park_budget)
        self.parking = ParkingPolicy(model.size_bytes, model.cell_bytes(kv_type), park_threshold)
        self.kv_type = kv_type
        self.rotation_budget = rotation_budget
        self.canary_tolerance = canary_tolerance_of("ggml", kv_type, canary_tolerance)
        self.prefix_cache = prefix_cache
        # a sliding-window model's local layers keep only the window's rows (and rotate with their
        # own RoPE base): a splice that moves rows back into the window would find them gone
        shiftable = self.ctx.can_shift and not model.n_swa
        # moves through the state API (cost follows the moved cells) where the check passes
        self.shifter = verified_shifter(model, self.ctx, CANARY_SEQS[:2], self.canary_tolerance) if shiftable else None
        # the canary's reference keys from a context that stops after layer 0, where it agrees exactly
        self.probe = verified_probe(model, self.cache, CANARY_SEQS) if shiftable else None
        capacity = self.ctx.n_ctx
        self._info = ModelInfo(
            name=name,
            vocab_size=model.n_vocab,
            eos_token_ids=tuple(eos_token_ids if eos_token_ids is not None else model.eos_tokens()),
            max_context_tokens=min(context, capacity),  # llama.cpp only ever rounds n_ctx up
            kv_capacity_tokens=capacity,
            shiftable=shiftable,
            unshiftable_reason=None if shiftable else unshiftable_reason(model.n_swa),
            engine="llamacpp",
            parks_idle=park_budget > 0,
            retracts=True,
        )

    @property
    def info(self) -> ModelInfo:
        """What the service needs to know about the model."""
        return self._info

    def drop_idle(self) -> int:
        """Evict every unpinned entry, resident or parked; how many went (benchmarks start from a clean pool)."""
        return self.cache.evict_all()

    def close(self) -> None:
        """Free the contexts and the model."""
        if self.probe is not None:
            self.probe.close()
        self.ctx.close()
        self.model.close()

    # -- prefill and decode ---------------------------------------------------------------------
    def _target(self, tokens: list[int], scope: CacheScope, previous: Entry | None) -> tuple[Entry, int, int, bool]:
        """(entry to extend, reused tokens, exact among them, whether the entry is new)."""
        cache = self.cache
        limit = tokens[:-1] if self.prefix_cache else []
        best, n = cache.best_match(limit, scope, prefer=previous)
        exact = min(n, best.exact) if best is not None else 0
        if best is not None and (best is previous or (not best.pinned and (n == best.cached or _own(best, scope)))):
            # take the sequence over: the caller's own, a cache entry used whole, or an old branch of
            # the same session (its tail would only widen every decode's attention window)
            cache.trim(best, n)  # (a parked one comes back first)
            best.pinned = True
            return best, n, exact, False
        if previous is not None and best is None:
            cache.trim(previous, 0)
            return previous, 0, 0, False
        entry = cache.new_entry(scope, protect=(best,) if best is not None else ())
        if best is not None and best.resident:
            cache.share(best, entry, n)
        elif best is not None:
            cache.restore_prefix(best, entry, n)  # a private copy; the parked entry stays parked
        return entry, n, exact, True

    def _focus(self, entry: Entry) -> None:
        """Before computing for ``entry``: it is resident, idle sequences that would slow it are parked."""
        focus(self.cache, entry, self.parking, CANARY_SEQS[-1])

    def prefill(self, tokens: Sequence[int], scope: CacheScope = SHARED, previous: Handle | None = None) -> Prefilled:
        """Cache ``tokens`` reusing the longest prefix visible in ``scope``; ``last_logits`` set.

        At least the last token is computed, so its logits are fresh. ``previous`` is released
        (its sequence may be taken over) on success; on an error it is left to the caller.
        """
        return prefill_whole(self, tokens, scope, previous)

    def start_prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> SeqPrefill:
        """Match (or take over ``previous``'s sequence) and hold the entry to extend; compute nothing.

        The prefix cache never offers the last token, so at least it is left to compute. The
        entry is pinned and ``busy`` until the job ends: nothing evicts, parks or takes it over
        while other jobs run between its chunks.
        """
        tokens = list(tokens)
        prev = _entry(previous) if previous is not None else None
        if not tokens:
            return SeqPrefill(tokens, scope, previous)
        entry, reused, exact, new = self._target(tokens, scope, prev)
        entry.scope = scope
        entry.set_tokens(entry.tokens, reused if exact >= reused else exact, entry.rotations)
        job = SeqPrefill(tokens, scope, previous, reused, reused - exact, reused, entry=entry, new=new, prev=prev)
        entry.busy += 1
        try:
            self._focus(entry)
        except BaseException:
            self.abort_prefill(job)
            raise
        return job

    def forward(self, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> StepFailures:
        """One step: every chunk's tokens and every decode's ``pending`` token in one ``llama_decode``
        (several, in order, past ``n_batch``); see :mod:`.batch`."""
        return forward(self.cache, chunks, decodes)

    def finish_prefill(self, job: PrefillJob) -> Prefilled:
        """The prefilled sequence as a locked handle; ``job.previous`` is released (or taken over)."""
        done = SeqPrefill.of(job)
        if done.left:
            raise ValueError(f"finish_prefill with {done.left} tokens left to compute")
        entry, previous = done.entry, done.previous
        done.entry = None
        if entry is None:  # an empty prompt: nothing cached
            if previous is not None:
                self.release(previous)
            return Prefilled(SeqHandle([], 0, 0, done.scope), 0, 0, None)
        entry.busy -= 1
        self.cache.touch(entry)
        if previous is not None:
            if entry is done.prev:
                previous.entry = None  # type: ignore[attr-defined]
            else:
                self.release(previous)
        handle = SeqHandle(done.tokens, entry.cached, entry.exact, done.scope, entry)
        return Prefilled(handle, done.reused, done.approximate, done.logits)

    def abort_prefill(self, job: PrefillJob) -> None:
        """Give back the job's entry: a new one is dropped, a taken cache entry released as cache
        (with what its chunks computed); ``previous`` stays with the caller."""
        taken = SeqPrefill.of(job)
        entry, taken.entry = taken.entry, None
        if entry is None:
            return
        entry.busy -= 1
        if taken.new:
            self.cache.drop(entry)
        elif entry is not taken.prev:
            self.cache.release(entry)

    def release(self, handle: Handle) -> None:
        """Unpin a handle's sequence (it stays as evictable cache); releasing twice is harmless."""
        entry = _entry(handle)
        if entry is not None:
            handle.entry = None  # type: ignore[attr-defined]
            self.cache.release(entry)

    def decode(
        self,
        handle: Handle,
        last_logits: np.ndarray | None,
        params: SamplingParams,
        delivered: Callable[[], int] | None = None,
        processors: Processors | None = None,
    ) -> Generator[GenerationStep, None, None]:
        """Yield decoded tokens after ``handle`` (``last_logits``: its prefill's last row); when closed,
        ``handle`` gets the first ``delivered()`` of them and KV for no token past them.
        ``processors`` mask each row in llama.cpp's own buffer; a finished one ends with ``stop``."""
        return decode_steps(self, handle, last_logits, params, delivered, processors)

    def start_decode(
        self, handle: Handle, last_logits: Logits, params: SamplingParams, processors: Processors | None = None
    ) -> SeqDecode:
        """A decode job after ``handle`` (its entry resident and ``busy`` until ``finish_decode``)."""
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self._info.eos_token_ids))
        return start_decode(self.cache, handle, _entry(handle), last_logits, params, processors, stops)

    def sample(self, job: DecodeJob) -> GenerationStep:
        """The next token from ``job``'s logits: the prefill's row, or its row of the last ``forward``
        in llama.cpp's buffer (sample before any other computation); see :func:`.batch.sample`."""
        return sample(self.ctx, job)

    def finish_decode(self, job: DecodeJob, delivered: int) -> None:
        """Commit the first ``delivered`` generated tokens to the handle, trimming the sequence to them."""
        finish_decode(self.cache, job, delivered)

    def retract_decode(self, job: DecodeJob) -> None:
        """Park the job's sequence out of the pool (see :func:`.batch.retract_decode`)."""
        batch.retract_decode(self.cache, job)

    def resume_decode(self, job: DecodeJob, prefilled: Prefilled) -> None:
        """Decode on in the prefilled context (see :func:`.batch.resume_decode`)."""
        batch.resume_decode(job, prefilled)

    # -- splice stages (SpliceBackend) ------------------------------------------------------------
    def rotation_counts(self, handle: Handle, positions: Sequence[int]) -> list[int] | None:
        """How often the keys at ``positions`` of ``handle`` were rotated already."""
        entry = _entry(handle)
        if entry is None:
            return [0] * len(positions)
        return [int(x) for x in entry.rotations[np.asarray(list(positions), dtype=np.int64)]]

    def begin(self, handle: Handle, keep: int) -> Stage:
        """A stage on ``handle``'s own sequence that keeps its first ``keep`` tokens where they are."""
        entry = _entry(handle)
        if entry is None:
            return Stage(handle, self.cache.new_entry(handle.scope), 0, owned=True)
        self._focus(entry)
        stage = Stage(handle, entry, keep, shifter=self.shifter, scratch=COPY)  # held: never parked meanwhile
        try:
            self.cache.unshare_after(entry, keep, COPY)
        except BaseException:
            stage.unhold()
            raise
        return stage

    def move(self, stage: Stage, handle: Handle, runs: Sequence[KeptRun]) -> None:
        """Move kept ``runs`` of the stage's own sequence, or place a copy of another handle's (a block)."""
        source = _entry(handle)
        if source is stage.entry and not stage.prepared:
            prepare(self.cache, stage, runs)
            return
        prepare(self.cache, stage, ())
        if source is None:
            raise ValueError("moving rows of a released handle")
        for run in runs:
            move_block(self.cache, stage, source, run, COPY)

    def fill(self, stage: Stage, at: int, tokens: Sequence[int]) -> None:
        """Compute ``tokens`` at positions ``[at, ...)`` attending to the staged ``[0, at)``."""
        prepare(self.cache, stage, ())
        if stage.pending is not None and at > stage.pending_from:
            land(self.cache, stage)  # the moved cells are part of this fill's context
        ctx, seq = self.ctx, stage.entry.seq
        if ctx.pos_max(seq) == at - 1:  # nothing staged past ``at``: decode in place
            self.cache.decode(seq, list(tokens), at, want_logits=False)
        else:
            ctx.seq_rm(SCRATCH)
            if at:
                ctx.seq_cp(seq, SCRATCH, 0, at)
            self.cache.decode(SCRATCH, list(tokens), at, want_logits=False)
            ctx.seq_cp(SCRATCH, seq, at, at + len(tokens))
            ctx.seq_rm(SCRATCH)
        stage.set_rotations(at, np.zeros(len(tokens), dtype=np.int32))

    def canary(self, stage: Stage, positions: Sequence[int], tokens: Sequence[int]) -> CanaryResult:
        """Compare staged layer-0 keys at ``positions`` with the model's own keys for ``tokens``."""
        return run_canary(self.cache, self.probe, stage, positions, tokens, self.canary_tolerance, CANARY_SEQS, COPY)

    def commit(self, stage: Stage, tokens: Sequence[int], exact: int, previous: Handle) -> SeqHandle:
        """Describe the staged sequence as ``tokens`` under ``previous``'s scope; ``previous`` is consumed."""
        try:
            prepare(self.cache, stage, ())
            land(self.cache, stage)
        except BaseException:
            self._cut(stage)
            raise
        finally:
            stage.unhold()
        entry = stage.entry
        n = min(len(tokens), self.ctx.pos_max(entry.seq) + 1)
        entry.set_tokens(list(tokens[:n]), exact, stage.rotations(n))
        entry.scope = previous.scope
        entry.pinned = True
        self.cache.touch(entry)
        if _entry(previous) is not entry:
            self.release(previous)
        previous.entry = None  # type: ignore[attr-defined]
        return SeqHandle(list(tokens), n, entry.exact, previous.scope, entry)

    def abort(self, stage: Stage) -> None:
        """Undo what cannot be kept: the sequence is cut back to ``keep`` (the handle says so)."""
        stage.unhold()
        self._cut(stage)

    def _cut(self, stage: Stage) -> None:
        stage.pending = None  # lifted cells are dropped with the tail they belonged to
        for seq in (SCRATCH, COPY, *CANARY_SEQS):
            self.ctx.seq_rm(seq)
        if stage.owned:
            self.cache.drop(stage.entry)
        elif stage.prepared:
            self.cache.trim(stage.entry, stage.keep)
            handle = stage.handle
            handle.cached, handle.exact = stage.entry.cached, stage.entry.exact

    def check(self, handle: Handle) -> None:
        """Tests: the handle's sequence holds exactly positions ``[0, cached)`` (or, parked, none)."""
        entry = _entry(handle)
        cached = entry.cached if entry is not None else 0
        if handle.cached != cached:
            raise AssertionError(f"handle says {handle.cached} cached tokens, the entry {cached}")
        if entry is not None:
            end = cached - 1 if entry.resident else -1  # a parked sequence holds no cells
            if self.ctx.pos_max(entry.seq) != end:
                raise AssertionError(f"sequence {entry.seq} ends at {self.ctx.pos_max(entry.seq)}, expected {end}")
