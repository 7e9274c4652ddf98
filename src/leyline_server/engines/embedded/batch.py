"""The embedded engine's batched steps: prefill chunks and decode tokens of many sequences, one forward.

The jobs' lives are drawn in :mod:`leyline_server.contract.jobs`. Slots while a job runs: a
prefill job holds its locked cache hit plus the slots of the chunks computed so far (in flight:
allocated, in no radix node, so no eviction can take them); a decode job holds its handle's
locked path plus one in-flight slot per generated token whose KV exists. Finishing inserts them
into the radix tree (:meth:`EmbeddedEngine._commit`); aborting frees them.

Retracting a decode job commits its sequence (the handle's tokens and the generated tokens with
KV) into the tree and unlocks it: ordinary cache, evicted least recently used first when the pool
needs room, as SGLang's retraction gives a request's KV back to its radix cache. Its resume is a
prefill of the same tokens, which reuses what was not evicted; the job's handle is bound to the
result in place (``kept``: the generated tokens whose slots the tree already owns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from leyline_server.contract.jobs import Chunk, DecodeJob, PrefillJob, StepFailures, chunk_tokens
from leyline_server.contract.logits import Processors
from leyline_server.contract.values import (
    CacheScope,
    CapacityError,
    GenerationStep,
    Handle,
    ModelInfo,
    Prefilled,
    SamplingParams,
)
from leyline_server.engines.embedded.mirror import MirrorStore
from leyline_server.engines.embedded.packed import Segment, forward_packed
from leyline_server.engines.embedded.pool import SlotPool
from leyline_server.engines.embedded.radix import Node
from leyline_server.engines.embedded.sampling import Sampler

__all__ = ["Pinned", "SlotEngine", "SlotPrefill", "SlotDecode", "start_prefill", "forward", "finish_prefill"]
__all__ += ["abort_prefill", "start_decode", "sample", "finish_decode", "retract_decode", "resume_decode"]


@dataclass
class Pinned(Handle):
    """A handle whose cached tokens sit in ``slots`` on the locked radix path ending at ``node``."""

    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    node: Node | None = None


class SlotEngine(Protocol):
    """What the steps need of :class:`~leyline_server.engines.embedded.engine.EmbeddedEngine`."""

    model: Any
    pool: SlotPool
    mirrors: MirrorStore
    prefix_cache: bool

    @property
    def info(self) -> ModelInfo: ...
    def alloc(self, n: int) -> torch.Tensor: ...
    def free(self, slots: torch.Tensor) -> None: ...
    def match(self, tokens: Sequence[int], scope: CacheScope = ...) -> Pinned: ...
    def release(self, handle: Handle) -> None: ...
    def _commit(
        self, tokens: Sequence[int], slots: torch.Tensor, scope: CacheScope, exact: int, previous: Handle | None
    ) -> Pinned: ...


def _exact_after(handle_exact: int, handle_cached: int, length: int) -> int:
    """Exact tokens of a sequence extended from a cached one: all of them iff the base was exact."""
    return length if handle_exact >= handle_cached else handle_exact


@dataclass(eq=False)
class SlotPrefill(PrefillJob):
    """A prefill job's slots: the locked hit, then the chunks computed so far."""

    hit: Pinned | None = None
    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    fresh: list[torch.Tensor] = field(default_factory=list)


@dataclass(eq=False)
class SlotDecode(DecodeJob):
    """A decode job's sampler, stop tokens, and the slots of its context and generated tokens:
    ``slots`` holds the handle's then the generated tokens' with KV, the first ``kept`` of those
    owned by the tree (after a resume), the rest in flight (``fresh``, one tensor a token)."""

    sampler: Sampler | None = None
    stops: set[int] = field(default_factory=set)
    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    fresh: list[torch.Tensor] = field(default_factory=list)
    kept: int = 0


def start_prefill(engine: SlotEngine, tokens: Sequence[int], scope: CacheScope, previous: Handle | None) -> SlotPrefill:
    """Match and lock the longest cached prefix of ``tokens[:-1]`` (the last token is always computed)."""
    tokens = list(tokens)
    hit = engine.match(tokens[:-1] if engine.prefix_cache else [], scope)
    approximate = hit.cached - hit.exact
    return SlotPrefill(tokens, scope, previous, hit.cached, approximate, hit.cached, hit=hit, slots=hit.slots)


def _segments(
    engine: SlotEngine, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob], failures: StepFailures
) -> list[tuple[object, Segment]]:
    """Each job's segment with freshly allocated slots; a job that gets no slots goes to ``failures``."""
    out: list[tuple[object, Segment]] = []
    for d in decodes:
        job = SlotDecode.of(d)
        try:
            slots = engine.alloc(1)
        except CapacityError as exc:
            failures[job] = exc
            continue
        assert job.pending is not None
        out.append((job, Segment(job.slots, [job.pending], slots, True)))
    for chunk in chunks:
        prefill = SlotPrefill.of(chunk.job)
        try:
            slots = engine.alloc(chunk.tokens)
        except CapacityError as exc:
            failures[prefill] = exc
            continue
        last = chunk.tokens == prefill.left
        out.append((prefill, Segment(prefill.slots, chunk_tokens(prefill, chunk.tokens), slots, last)))
    return out


def forward(engine: SlotEngine, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> StepFailures:
    """One packed forward over every chunk and decode token (see :class:`~engines.base.SyncCore`)."""
    failures: StepFailures = {}
    work = _segments(engine, chunks, decodes, failures)
    if not work:
        return failures
    try:
        rows = forward_packed(engine.model, engine.pool, engine.mirrors, [seg for _, seg in work])
    except BaseException:
        for _, seg in work:
            engine.free(seg.slots)
        raise
    for (job, seg), row in zip(work, rows, strict=True):
        if isinstance(job, SlotDecode):
            job.fresh.append(seg.slots)
            job.slots = torch.cat([job.slots, seg.slots])
            job.pending, job.logits = None, row
        else:
            assert isinstance(job, SlotPrefill)
            job.fresh.append(seg.slots)
            job.slots = torch.cat([job.slots, seg.slots])
            job.done += len(seg.tokens)
            if row is not None:
                job.logits = row
    return failures


def finish_prefill(engine: SlotEngine, prefill: PrefillJob) -> Prefilled:
    """Insert the prefilled sequence into the radix tree, locked; release ``previous`` and the hit."""
    job = SlotPrefill.of(prefill)
    assert job.hit is not None and job.left == 0
    hit, job.hit = job.hit, None
    try:
        exact = _exact_after(hit.exact, hit.cached, len(job.tokens))
        pinned = engine._commit(job.tokens, job.slots, job.scope, exact, job.previous)
    except BaseException:
        for slots in job.fresh:
            engine.free(slots)
        raise
    finally:
        engine.release(hit)
    return Prefilled(pinned, job.reused, job.approximate, job.logits)


def abort_prefill(engine: SlotEngine, prefill: PrefillJob) -> None:
    """Free the chunks' slots and unlock the hit (``previous`` stays with the caller)."""
    job = SlotPrefill.of(prefill)
    for slots in job.fresh:
        engine.free(slots)
    job.fresh.clear()
    if job.hit is not None:
        engine.release(job.hit)
        job.hit = None


def start_decode(
    engine: SlotEngine,
    handle: Handle,
    last_logits: torch.Tensor,
    params: SamplingParams,
    processors: Processors | None,
) -> SlotDecode:
    """A decode job after ``handle``, its first token to be sampled from ``last_logits``."""
    pinned = Pinned.of(handle)
    stops = Sampler.stops(params, engine.info.eos_token_ids)
    job = SlotDecode(pinned, params, processors, logits=last_logits, sampler=Sampler(params, processors), stops=stops)
    job.slots = pinned.slots
    job.finished = params.max_tokens <= 0
    return job


def sample(engine: SlotEngine, decode: DecodeJob) -> GenerationStep:
    """The next token from the job's logits; it ends the stream or becomes ``pending``."""
    job = SlotDecode.of(decode)
    assert job.sampler is not None and job.logits is not None and not job.finished
    step = job.sampler.step(job.logits)
    job.generated.append(step.token)
    job.logits = None
    done = step.token in job.stops or job.sampler.finished
    if done or len(job.generated) >= job.params.max_tokens:
        step.finish_reason = "stop" if done else "length"
        job.finished = True
    else:
        job.pending = step.token
    return step


def finish_decode(engine: SlotEngine, decode: DecodeJob, delivered: int) -> None:
    """Commit the first ``delivered`` generated tokens to the handle (in place); free the rest's KV.

    A retracted job holds no slots: its handle becomes its tokens locked as far as they are still
    cached (the tree may have evicted the tail).
    """
    job = SlotDecode.of(decode)
    pinned: Pinned = job.handle  # type: ignore[assignment]
    n = min(max(delivered, 0), len(job.generated))
    for extra in job.fresh[max(0, n - job.kept) :]:
        engine.free(extra)
    job.fresh = []
    tokens = pinned.tokens + job.generated[:n]
    if job.retracted:
        new = engine.match(tokens, pinned.scope)
    else:
        with_kv = len(job.slots) - len(pinned.tokens)
        slots = job.slots[: len(pinned.tokens) + min(n, with_kv)]
        exact = _exact_after(pinned.exact, pinned.cached, len(slots))
        new = engine._commit(tokens, slots, pinned.scope, exact, previous=pinned)
    _bind(pinned, new)
    job.slots, job.kept = new.slots, 0


def _bind(pinned: Pinned, new: Pinned) -> None:
    """``pinned`` becomes ``new`` in place (the turn's handle object is the session's)."""
    pinned.tokens, pinned.cached, pinned.exact = new.tokens, new.cached, new.exact
    pinned.slots, pinned.node = new.slots, new.node


def retract_decode(engine: SlotEngine, decode: DecodeJob) -> None:
    """Give the job's slots back: its sequence committed to the tree, unlocked (evictable cache)."""
    job = SlotDecode.of(decode)
    pinned: Pinned = job.handle  # type: ignore[assignment]
    if job.retracted or job.pending is None:
        raise ValueError("retract_decode() needs a running job whose last token was sampled")
    tokens = pinned.tokens + job.generated[: len(job.slots) - len(pinned.tokens)]
    exact = _exact_after(pinned.exact, pinned.cached, len(job.slots))
    cached = engine._commit(tokens, job.slots, pinned.scope, exact, previous=pinned)
    engine.release(cached)
    pinned.node, pinned.slots, pinned.cached, pinned.exact = None, cached.slots[:0], 0, 0  # holds nothing
    job.slots, job.fresh, job.kept, job.retracted = pinned.slots, [], 0, True


def resume_decode(engine: SlotEngine, decode: DecodeJob, prefilled: Prefilled) -> None:
    """Bind a retracted job to the prefill of its context: the handle holds its prompt's slots
    (locked through the context's node), the generated tokens' slots are the tree's."""
    job = SlotDecode.of(decode)
    pinned: Pinned = job.handle  # type: ignore[assignment]
    context = Pinned.of(prefilled.handle)
    prompt = len(pinned.tokens)
    if not job.retracted or context.tokens[:prompt] != pinned.tokens or context.cached != len(context.tokens):
        raise ValueError("resume_decode() needs a retracted job and its context, prefilled")
    pinned.slots, pinned.node = context.slots[:prompt], context.node
    pinned.cached, pinned.exact = prompt, min(context.exact, prompt)
    job.slots, job.fresh, job.kept, job.retracted = context.slots, [], len(context.tokens) - prompt, False
