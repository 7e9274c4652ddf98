"""Retraction: when the pool runs short, a running stream gives its KV back and resumes later.

In the shape of SGLang's ``retract_decode``, on the CPU engines' thread
(:class:`~leyline_server.engines.scheduler.Scheduler`):

* **When.** A step's decode finds no room in the pool (:class:`CapacityError` for its next token,
  after the engine evicted what cache it could). Running streams come first: a prefill chunk
  without room retracts only a stream that sits out for its reader (``RUN_AHEAD`` tokens ahead of
  it: it decodes nothing meanwhile), and otherwise waits (see the scheduler).
* **Whom.** One stream per short step, chosen by :func:`victim`: a stream paused by its reader
  first (it holds KV and decodes nothing), then SGLang's order: the fewest generated tokens (the
  least work lost), the longest context among those (the most room freed). The last running
  stream is retracted only when prefill work in progress holds room (that work then finishes and
  frees it); otherwise its decode fails as before (503 ``capacity``).
* **How.** ``core.retract_decode``: the embedded engine commits the stream's sequence to its radix
  tree unlocked (cache, evicted as the pool needs it, as SGLang's radix cache); llama.cpp parks
  its sequence in host memory (``--swap-space``). The stream keeps what it generated, its sampler
  and its processors; its consumer just waits.
* **Resume.** Oldest retracted first, one at a time, once room came back (a stream ended, a
  release or another job ran, a prefill was dropped; with nothing else decoding, every second): a
  prefill of
  the stream's context (:func:`~leyline_server.contract.jobs.context`), chunked like any other but
  served before new prefills, reuses what is still cached (or restores the parked sequence) and
  recomputes the rest; then ``core.resume_decode`` and the stream decodes on from its pending
  token. What it generates is what it would have generated unretracted (greedy: the same
  tokens; the tests check it against the stream decoded alone). A stream that cannot be resumed
  for ``STUCK_S`` seconds while nothing else decodes fails as a decode without room always did
  (503 ``capacity``): the service keeps idle cache within what reservations leave, so this takes
  a pool held by something no reservation covers.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from leyline_server.contract.jobs import PrefillJob, context
from leyline_server.contract.values import CapacityError
from leyline_server.engines.scheduling import Stream

__all__ = ["Resume", "Retractions", "victim", "STUCK_S"]

log = logging.getLogger("leyline.engine")
STUCK_S = 10.0  # seconds a retracted stream may wait for room with nothing else decoding


def victim(streams: Iterable[Stream], ahead: int) -> Stream:
    """The stream to retract (module docstring): paused by its reader first, then the fewest
    generated tokens, then the longest context."""
    return min(streams, key=lambda s: (s.runnable(ahead), s.generated, -len(s.handle.tokens)))


@dataclass(eq=False)
class Resume:
    """A retracted stream being brought back: the prefill of its context."""

    stream: Stream
    job: PrefillJob
    blocked: bool = False  # its last chunk found no room: it waits for room to come back


class Retractions:
    """The retracted streams of one scheduler and the one resume in progress (engine thread only)."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.waiting: deque[Stream] = deque()
        self.resume: Resume | None = None
        self.freed = False  # room came back since the last resume was tried
        self.total = 0  # streams retracted since start
        self.stuck_since: float | None = None  # nothing else decodes, and no resume could go on

    def holds(self, stream: Stream) -> bool:
        """Whether ``stream`` is retracted (waiting, or being resumed)."""
        return stream in self.waiting or (self.resume is not None and self.resume.stream is stream)

    def ready(self) -> bool:
        """Whether the next round has resume work: a chunk to compute, or a resume to try."""
        if self.resume is not None:
            return not self.resume.blocked and self.resume.job.left > 0
        return bool(self.waiting) and self.freed

    def patience(self, running: bool) -> float | None:
        """How long the idle engine thread waits before trying again (``None``: until woken)."""
        stuck = self.waiting or (self.resume is not None and self.resume.blocked)
        if not stuck or running:
            self.stuck_since = None
            return None
        return 1.0

    def try_again(self) -> None:
        """Nothing woke the idle engine thread: try to resume again, or, stuck for ``STUCK_S``,
        fail the stream waiting longest (its decode finds no room, as without retraction)."""
        now = time.monotonic()
        self.stuck_since = self.stuck_since or now
        if now - self.stuck_since < STUCK_S:
            self.came_back()
            return
        self.stuck_since = None
        stream = self.resume.stream if self.resume is not None else self.waiting[0]
        self.drop(stream)
        self._fail(stream, CapacityError(f"no room in the KV pool to resume this stream for {STUCK_S:g} s"))

    def came_back(self) -> None:
        """Room came back to the pool: the resume may try again."""
        self.freed = True
        if self.resume is not None:
            self.resume.blocked = False

    def retract(self, stream: Stream) -> None:
        """Give ``stream``'s KV back to the pool and queue it for a resume."""
        assert stream.job is not None
        self.core.retract_decode(stream.job)
        self.waiting.append(stream)
        self.total += 1
        log.info(
            "KV pool short: retracted a stream of key %s (%d tokens generated, context %d); it resumes later",
            stream.key, stream.generated, len(context(stream.job)),
        )  # fmt: skip

    def start(self) -> None:
        """Start resuming the oldest retracted stream, if room came back."""
        if self.resume is not None or not self.waiting or not self.freed:
            return
        self.freed = False
        stream = self.waiting[0]
        job = stream.job
        assert job is not None
        try:
            prefill = self.core.start_prefill(context(job), job.handle.scope, job.handle)
        except CapacityError:
            return  # not enough room yet
        except BaseException as exc:  # noqa: BLE001 - the stream's own error
            self.waiting.popleft()
            self._fail(stream, exc)
            return
        self.waiting.popleft()
        self.resume = Resume(stream, prefill)

    def advanced(self, failure: BaseException | None, retry: bool) -> Stream | None:
        """After a step that ran the resume's chunk: the stream, once it decodes again. A chunk
        without room is tried again next step (``retry``: streams decode) or when room comes back."""
        resume = self.resume
        assert resume is not None and resume.stream.job is not None
        if isinstance(failure, CapacityError):
            resume.blocked = not retry
            return None
        if failure is None and resume.job.left:
            return None
        self.resume = None
        try:
            if failure is not None:
                self.core.abort_prefill(resume.job)
                raise failure
            prefilled = self.core.finish_prefill(resume.job)  # (on failure it gave back what it took)
        except BaseException as exc:  # noqa: BLE001 - the stream's own error
            return self._fail(resume.stream, exc)
        try:
            self.core.resume_decode(resume.stream.job, prefilled)
        except BaseException as exc:  # noqa: BLE001 - the stream's own error (it stays retracted)
            self.core.release(prefilled.handle)
            return self._fail(resume.stream, exc)
        return resume.stream

    @staticmethod
    def _fail(stream: Stream, exc: BaseException) -> None:
        stream.failed = True
        stream.deliver(exc)

    def drop(self, stream: Stream) -> None:
        """Forget ``stream`` (its consumer has gone); its resume, if under way, is aborted."""
        if stream in self.waiting:
            self.waiting.remove(stream)
        if self.resume is not None and self.resume.stream is stream:
            resume, self.resume = self.resume, None
            self.core.abort_prefill(resume.job)

    def all(self) -> list[Stream]:
        """Every retracted stream (waiting, or being resumed)."""
        return [*self.waiting, *([self.resume.stream] if self.resume is not None else [])]
