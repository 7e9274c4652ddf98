"""The work a batching engine core does step by step: prefills in chunks, decodes one token at a time.

A :class:`~leyline_server.contract.base.BatchCore` hands these out and advances them; the
scheduler (:mod:`leyline_server.engines.scheduler`) decides what goes into each step. Engines
subclass both jobs to carry their own references (slots, a sequence); the scheduler reads only
what is declared here.

A prefill job's life: ``start_prefill`` (the longest cached prefix is matched and locked, nothing
computed) → ``forward`` of chunks until ``left`` is 0 (``logits`` then holds the last token's
row) → ``finish_prefill`` (the sequence cached and pinned, ``previous`` released) or
``abort_prefill`` (everything the job took given back; ``previous`` stays with the caller).

A decode job's life: ``start_decode`` → ``sample`` (the next token from the current logits; it
becomes ``pending`` unless it ended the stream) → ``forward`` (``pending``'s KV computed, new
logits) → ``sample`` → … → ``finish_decode(delivered)`` (the first ``delivered`` generated tokens
kept on the handle, the KV of any decoded after them dropped).

When the pool runs short a running decode job may be *retracted* between steps
(``retract_decode``: its KV given back to the pool as cache, or parked in host memory; what it
generated, its sampler and its processors stay with the job) and *resumed* later: a prefill job
of :func:`context` brings its KV back (matched from what is still cached or parked, the rest
recomputed) and ``resume_decode`` binds the job to it, ``pending`` still next. A retracted job
can be finished like any other (the handle keeps what is still cached of its tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from typing_extensions import Self

from leyline_server.contract.logits import Processors
from leyline_server.contract.values import CacheScope, Handle, Logits, SamplingParams

__all__ = ["PrefillJob", "DecodeJob", "Chunk", "StepFailures", "chunk_tokens", "context"]


@dataclass(eq=False)
class PrefillJob:
    """A prefill in progress: ``tokens[:done]`` hold KV (``reused`` of them found cached)."""

    tokens: list[int]
    scope: CacheScope
    previous: Handle | None
    reused: int = 0
    approximate: int = 0  # of the reused tokens, those rotated or downstream of a rotation
    done: int = 0
    logits: Logits = None  # the last token's logits row, once ``left`` is 0 (an owned copy)

    @classmethod
    def of(cls, job: PrefillJob) -> Self:
        """``job`` as this engine's own job type (``cls``); ``TypeError`` for another engine's."""
        if not isinstance(job, cls):
            raise TypeError(f"not a prefill job of this engine: a {type(job).__name__}, not a {cls.__name__}")
        return job

    @property
    def left(self) -> int:
        """Tokens still to compute."""
        return len(self.tokens) - self.done


@dataclass(eq=False)
class DecodeJob:
    """One stream's decoding after ``handle``: what it generated, and the token whose KV is next."""

    handle: Handle
    params: SamplingParams
    processors: Processors | None = None
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled, KV not computed yet (the next forward computes it)
    finished: bool = False
    logits: Logits = None  # the row the next ``sample`` reads (engine-specific form)
    retracted: bool = False  # its KV was given back to the pool (``retract_decode``); not decoding

    @classmethod
    def of(cls, job: DecodeJob) -> Self:
        """``job`` as this engine's own job type (``cls``); ``TypeError`` for another engine's."""
        if not isinstance(job, cls):
            raise TypeError(f"not a decode job of this engine: a {type(job).__name__}, not a {cls.__name__}")
        return job

    @property
    def position(self) -> int:
        """Where ``pending`` sits in the sequence."""
        return len(self.handle.tokens) + len(self.generated) - 1


class Chunk(NamedTuple):
    """``tokens`` more tokens of a prefill job in one step."""

    job: PrefillJob
    tokens: int


# What a step could not do, by job (its exception); every other job in the step advanced.
StepFailures = dict[object, BaseException]


def chunk_tokens(job: PrefillJob, n: int) -> Sequence[int]:
    """The next ``n`` tokens of ``job`` (those a chunk of ``n`` computes)."""
    return job.tokens[job.done : job.done + n]


def context(job: DecodeJob) -> list[int]:
    """The tokens whose KV a running (or retracted) decode job holds: its handle's, then every
    generated token but ``pending`` (sampled, KV not computed yet)."""
    with_kv = len(job.generated) - (1 if job.pending is not None else 0)
    return list(job.handle.tokens) + job.generated[:with_kv]
