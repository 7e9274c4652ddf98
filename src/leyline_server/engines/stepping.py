"""One sequence driven through a batching core's steps: a whole prefill, a decode generator.

The scheduler (:mod:`leyline_server.engines.scheduler`) mixes many jobs into each step; the splice
executor, tests and benchmarks want one sequence at a time, synchronously. These two functions
are that, on the same primitives (:class:`~leyline_server.contract.base.SyncCore`), so a core has
one way to compute KV whoever drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from leyline_server.contract.jobs import Chunk
from leyline_server.contract.logits import Processors
from leyline_server.contract.values import CacheScope, GenerationStep, Handle, Logits, Prefilled, SamplingParams

__all__ = ["prefill_whole", "decode_steps"]


def prefill_whole(core: Any, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled:
    """Prefill ``tokens`` in one chunk (reusing the cached prefix); ``previous`` is released on
    success and left to the caller on an error (``CapacityError`` included)."""
    job = core.start_prefill(tokens, scope, previous)
    try:
        if job.left:
            failures = core.forward([Chunk(job, job.left)], [])
            if failures:
                raise failures[job]
    except BaseException:
        core.abort_prefill(job)
        raise
    return core.finish_prefill(job)


def decode_steps(
    core: Any,
    handle: Handle,
    last_logits: Logits,
    params: SamplingParams,
    delivered: Callable[[], int] | None = None,
    processors: Processors | None = None,
) -> Generator[GenerationStep, None, None]:
    """Yield decoded tokens after ``handle`` one forward at a time; when the generator ends or is
    closed, the first ``delivered()`` generated tokens (all of them without ``delivered``) are kept
    on ``handle`` and the KV of any decoded after them is dropped."""
    job = core.start_decode(handle, last_logits, params, processors)
    try:
        while not job.finished:  # (a job with max_tokens 0 starts finished)
            step = core.sample(job)
            yield step
            if job.finished:
                return
            failures = core.forward([], [job])
            if failures:
                raise failures[job]
    finally:
        n = len(job.generated) if delivered is None else min(max(0, delivered()), len(job.generated))
        core.finish_decode(job, n)
