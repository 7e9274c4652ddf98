"""The llama.cpp engine's batched steps: prefill chunks and decode tokens of many sequences, one ``llama_decode``.

The jobs' lives are drawn in :mod:`leyline_server.contract.jobs`; each job works on one cache
entry (one llama.cpp sequence of the unified pool), and no two jobs of a step share one.

* A prefill job's entry is pinned (never evicted, never taken over by another prefill) and
  ``busy`` (never parked, never compacted away) from ``start_prefill`` to
  ``finish_prefill``/``abort_prefill``, so other jobs may run between its chunks. The entry
  describes exactly the tokens with KV: ``job.done == entry.cached``.
* A decode job's entry is ``busy`` from ``start_decode`` to ``finish_decode``. ``pending`` (the
  last sampled token) has no KV yet; the entry describes everything before it, so ``pending``
  goes at position ``entry.cached`` (``job.position``).

:func:`forward` is all or nothing per job list: a step either advances every job it keeps or
leaves their sequences as they were (cells decoded by an earlier call of the step are removed
again), so failed jobs are never half advanced.

A decode job's logits after a step stay in llama.cpp's output buffer (:class:`OutputRow`): the
next ``sample`` reads the row in place, with the job's own sampler chain (``llama_sampler_sample``
at the row's batch index), and any ``llama_decode`` in between makes the row stale (an error, not
a silent wrong token). Rows a later call of the same step would overwrite are copied.

Retracting a decode job parks its entry (its cells serialised to host memory within
``--swap-space``, the KV kept exactly; dropped when the budget cannot hold it) and ends its
``busy``; its resume is a prefill of the same tokens with ``previous`` its handle, which restores
the parked entry (or recomputes what was dropped), and the job decodes on in that entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from leyline_server.contract.jobs import Chunk, DecodeJob, PrefillJob, StepFailures, chunk_tokens
from leyline_server.contract.logits import Processors
from leyline_server.contract.values import CapacityError, GenerationStep, Handle, Prefilled, SamplingParams
from leyline_server.engines.llamacpp.cache import Entry, SequenceCache
from leyline_server.engines.llamacpp.lib import LlamaContext, TokenSampler, logprobs

__all__ = ["SeqPrefill", "SeqDecode", "OutputRow", "forward", "start_decode", "sample", "finish_decode"]
__all__ += ["retract_decode", "resume_decode"]


@dataclass(eq=False)
class SeqPrefill(PrefillJob):
    """A prefill job on ``entry`` (``None`` for an empty prompt): ``new`` if the job created it,
    ``prev`` the entry of ``previous`` (which the job may have taken over)."""

    entry: Entry | None = None
    new: bool = False
    prev: Entry | None = None


@dataclass(eq=False)
class SeqDecode(DecodeJob):
    """A decode job on ``entry`` (``None`` for a released handle with nothing to decode), with its
    own sampler chain and stop tokens. ``logits``: a float32 row (the prefill's copy) or an
    :class:`OutputRow` of the last step."""

    entry: Entry | None = None
    sampler: TokenSampler | None = None
    stops: frozenset[int] = field(default_factory=frozenset)


class OutputRow(NamedTuple):
    """A logits row still in llama.cpp's buffer: batch index ``at`` of the context's call number ``call``."""

    at: int
    call: int


def _checked(chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> tuple[list[Chunk], list[SeqDecode]]:
    """The step's jobs as this engine's; ``ValueError`` for work that cannot be batched."""
    seqs: set[int] = set()
    out_chunks, out_decodes = [], []
    for chunk in chunks:
        prefill = SeqPrefill.of(chunk.job)
        if prefill.entry is None or not 0 < chunk.tokens <= prefill.left:
            raise ValueError(f"a chunk of {chunk.tokens} tokens for a prefill job with {prefill.left} left")
        assert prefill.entry.cached == prefill.done  # the entry describes exactly the tokens with KV
        seqs.add(prefill.entry.seq)
        out_chunks.append(Chunk(prefill, chunk.tokens))
    for decode in decodes:
        job = SeqDecode.of(decode)
        if job.entry is None or job.pending is None:
            raise ValueError("a decode job in a step needs a pending token (sample first)")
        seqs.add(job.entry.seq)
        out_decodes.append(job)
    if len(seqs) != len(out_chunks) + len(out_decodes):
        raise ValueError("two jobs of one step work on the same sequence")
    return out_chunks, out_decodes


def forward(cache: SequenceCache, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> StepFailures:
    """One step over every chunk and decode token (see :meth:`~leyline_server.contract.base.SyncCore.forward`).

    When the pool cannot make room for all of it, the chunks fail (:class:`CapacityError`) and
    the decodes are tried alone; when even they do not fit, they fail too.
    """
    step_chunks, step_decodes = _checked(chunks, decodes)
    failures: StepFailures = {}
    if step_chunks:
        if _run(cache, step_chunks, step_decodes):
            return failures
        error = CapacityError(f"the KV pool ({cache.ctx.n_ctx} cells) is full of live sessions")
        failures.update((chunk.job, error) for chunk in step_chunks)
    if step_decodes and not _run(cache, [], step_decodes):
        error = CapacityError(f"the KV pool ({cache.ctx.n_ctx} cells) has no room left for decoding")
        failures.update((job, error) for job in step_decodes)
    return failures


def _run(cache: SequenceCache, chunks: list[Chunk], decodes: list[SeqDecode]) -> bool:
    """Decode the step in as few calls as ``n_batch`` allows, then advance every job; ``False``
    (nothing advanced, every sequence as before) when the pool has no room for it."""
    ctx = cache.ctx
    triples: list[tuple[int, int, int]] = []
    wanted: list[int] = []  # batch indices (over the whole step) whose logits are kept
    entries: list[Entry] = []
    for chunk in chunks:
        job = chunk.job
        assert isinstance(job, SeqPrefill) and job.entry is not None
        seq, start = job.entry.seq, job.entry.cached  # == job.done
        triples.extend((seq, t, start + k) for k, t in enumerate(chunk_tokens(job, chunk.tokens)))
        if job.done + chunk.tokens == len(job.tokens):
            wanted.append(len(triples) - 1)
        entries.append(job.entry)
    for decode in decodes:
        assert decode.entry is not None and decode.pending is not None
        triples.append((decode.entry.seq, decode.pending, decode.entry.cached))
        wanted.append(len(triples) - 1)
        entries.append(decode.entry)
    # decodes go last: when the step takes several calls their rows are in the last one, in place
    rows = None
    try:
        rows = _decode_calls(cache, triples, wanted, entries)
    finally:
        if rows is None:  # no room, or an error: what earlier calls of the step decoded goes again
            for entry in entries:
                ctx.seq_rm(entry.seq, entry.cached, -1)
    if rows is None:
        return False
    at = 0
    for chunk in chunks:
        job = chunk.job
        assert isinstance(job, SeqPrefill) and job.entry is not None
        job.entry.append(chunk_tokens(job, chunk.tokens))
        job.done += chunk.tokens
        at += chunk.tokens
        if job.done == len(job.tokens):
            row = rows[at - 1]
            job.logits = row if isinstance(row, np.ndarray) else ctx.logits_view(row.at).copy()
    for decode in decodes:
        assert decode.entry is not None and decode.pending is not None
        decode.entry.append([decode.pending])
        decode.pending, decode.logits = None, rows[at]
        at += 1
    return True


def _decode_calls(
    cache: SequenceCache, triples: list[tuple[int, int, int]], wanted: list[int], protect: list[Entry]
) -> dict[int, np.ndarray | OutputRow] | None:
    """``triples`` decoded in calls of at most ``n_batch``, each retried after making room; the
    wanted rows by batch index (those of the last call in place, the others copied), or ``None``
    when the pool is full of what cannot be evicted or parked (the failing call changed nothing)."""
    ctx = cache.ctx
    step = ctx.n_batch
    rows: dict[int, np.ndarray | OutputRow] = {}
    for off in range(0, len(triples), step):
        part = triples[off : off + step]
        keep = [i - off for i in wanted if off <= i < off + step]
        while (rc := ctx.decode_rows(part, keep)) != 0:
            if rc != 1:
                raise RuntimeError(f"llama_decode failed (return code {rc})")
            if not cache.make_room(protect):
                return None
        last = off + step >= len(triples)
        for i in keep:
            rows[off + i] = OutputRow(i, ctx.calls) if last else ctx.logits_view(i).copy()
    return rows


def start_decode(
    cache: SequenceCache,
    handle: Handle,
    entry: Entry | None,
    last_logits: np.ndarray | None,
    params: SamplingParams,
    processors: Processors | None,
    stops: set[int],
) -> SeqDecode:
    """A decode job on ``handle``'s ``entry``: made resident and ``busy`` (never parked while the job
    runs), with its own sampler chain; the first token is sampled from ``last_logits``."""
    if entry is None and params.max_tokens:
        raise ValueError("decode needs a live handle")
    sampler = TokenSampler(params, cache.ctx.model.n_vocab)
    if entry is not None:
        try:
            cache.unpark(entry)
        except BaseException:
            sampler.close()
            raise
        entry.busy += 1
    job = SeqDecode(handle, params, processors, logits=last_logits, entry=entry, sampler=sampler)
    job.stops, job.finished = frozenset(stops), params.max_tokens == 0
    return job


def sample(ctx: LlamaContext, decode: DecodeJob) -> GenerationStep:
    """The next token from ``decode``'s logits (see :meth:`~leyline_server.contract.base.SyncCore.sample`).

    Processors mask the row before the sampler reads it: a copy of a copied row, llama.cpp's own
    buffer for a row still there. Logprobs are of the raw row (before processors and penalties).
    """
    job = SeqDecode.of(decode)
    if job.finished or job.pending is not None or job.sampler is None:
        raise ValueError("sample() needs a running decode job whose last token was forwarded")
    row, job.logits = job.logits, None
    params, processors = job.params, job.processors
    if isinstance(row, OutputRow) and row.call != ctx.calls:
        raise RuntimeError("the decode job's logits row was overwritten by a later llama_decode call")
    index = row.at if isinstance(row, OutputRow) else -1  # (no row at all: the context's last one)
    copied = row if isinstance(row, np.ndarray) else None
    raw = None  # the row logprobs are of, read before processors change it
    if params.logprobs:
        raw = copied if copied is not None else ctx.logits_view(index).copy()
    if copied is not None:
        masked = copied.copy() if processors else copied
        if processors:
            processors.apply(masked)
        token = job.sampler.sample(masked)
    else:
        if processors:
            processors.apply(ctx.logits_view(index))  # in place: the chain below reads this buffer
        token = job.sampler.sample_at(ctx, index)
    if processors:
        processors.accept(token)
    step = GenerationStep(token)
    if raw is not None:
        step.logprob, step.top_logprobs = logprobs(raw, token, params.top_logprobs)
    job.generated.append(token)
    done = token in job.stops or bool(processors and processors.finished)
    if done or len(job.generated) >= params.max_tokens:
        step.finish_reason = "stop" if done else "length"
        job.finished = True
    else:
        job.pending = token
    return step


def finish_decode(cache: SequenceCache, decode: DecodeJob, delivered: int) -> None:
    """The handle becomes its tokens plus the first ``delivered`` generated ones; the sequence is
    trimmed to them (it never holds KV for a token the client did not receive; the last delivered
    one may have none yet). Finishing twice changes nothing. A retracted job's parked entry stays
    parked when it holds nothing past them (else it is restored to be trimmed, or dropped when the
    pool has no room for it)."""
    job = SeqDecode.of(decode)
    if job.sampler is None:
        return
    job.sampler.close()
    job.sampler = None
    handle, entry = job.handle, job.entry
    handle.tokens = list(handle.tokens) + job.generated[: max(0, delivered)]
    if entry is not None:
        if not job.retracted:
            entry.busy -= 1
        _trim(cache, entry, len(handle.tokens))
        handle.cached, handle.exact = entry.cached, entry.exact


def _trim(cache: SequenceCache, entry: Entry, n: int) -> None:
    """``cache.trim(entry, n)``; a parked entry that holds nothing past ``n`` stays parked, one that
    cannot come back into the pool loses its KV instead (its handle then recomputes it)."""
    if not entry.resident and n >= entry.cached:
        return
    try:
        cache.trim(entry, n)
    except CapacityError:
        cache.trim(entry, 0)


def retract_decode(cache: SequenceCache, decode: DecodeJob) -> None:
    """Give the job's cells back to the pool: its entry parked in host memory (or its KV dropped)."""
    job = SeqDecode.of(decode)
    entry = job.entry
    if job.retracted or job.pending is None or entry is None:
        raise ValueError("retract_decode() needs a running job whose last token was sampled")
    entry.busy -= 1
    if not cache.park(entry):
        cache.trim(entry, 0)  # past --swap-space: recomputed at the resume
    job.retracted = True


def resume_decode(decode: DecodeJob, prefilled: Prefilled) -> None:
    """Bind a retracted job to the prefill of its context (the handle's entry, restored, or the
    entry the prefill chose): ``busy`` again, ``pending`` next."""
    job = SeqDecode.of(decode)
    entry = prefilled.handle.entry  # type: ignore[attr-defined]
    if not job.retracted or entry is None or entry.cached != len(prefilled.handle.tokens):
        raise ValueError("resume_decode() needs a retracted job and its context, prefilled")
    job.handle.entry = entry  # type: ignore[attr-defined]
    job.entry, job.retracted = entry, False
    entry.busy += 1
