"""What the scheduler schedules: prefill requests and streams, and the two choices each step makes.

:class:`PrefillRequest` and :class:`Stream` are created on the event loop and handed to the
engine thread (:class:`~leyline_server.engines.scheduler.Scheduler`); from then on only the
engine thread touches their jobs, and results go back through ``loop.call_soon_threadsafe``.
The flags the event loop writes (``cancelled``, ``closed``, ``taken``) are plain attributes that
the engine thread reads at its next round.

:func:`pick_decodes` and :func:`pick_chunks` are pure choices over those objects: which streams
decode in a step (keys take turns past ``max_running``), which prefills get a chunk (the key served
longest ago first; others join only whole).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from leyline_server.contract.jobs import DecodeJob, PrefillJob
from leyline_server.contract.logits import Processors
from leyline_server.contract.report import SpliceReport
from leyline_server.contract.values import CacheScope, Handle, Logits, Prefilled, PrefillProgress, SamplingParams

__all__ = ["PrefillRequest", "Stream", "Planned", "pick_decodes", "pick_chunks"]

# Runs on the engine thread before the prefill: the turn's splice, a generator that yields between
# slices of its work (the scheduler runs one slice a round) and returns the handle to prefill from
# (None: from the prefix cache alone) and the splice's report. It owns its failures and its close (a
# strict splice leaves the session as it was; any other error, or closing it, releases it).
Prepare = Callable[[Handle | None], Generator[None, None, tuple[Handle | None, SpliceReport | None]]]


@dataclass(eq=False)
class PrefillRequest:
    """A turn's prefill, queued by a key: prepared (spliced), then computed in chunks."""

    tokens: list[int]
    scope: CacheScope
    previous: Handle | None
    key: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[Prefilled, SpliceReport | None]]
    release: Callable[[Handle], None]  # from any thread: a result nobody took is released with it
    prepare: Prepare | None = None
    report: SpliceReport | None = None
    job: PrefillJob | None = None
    splicing: Generator[None, None, tuple[Handle | None, SpliceReport | None]] | None = None
    cancelled: bool = False  # the requester has gone (set from the event loop)
    progress: PrefillProgress | None = None  # the requester's view of how far the job has come
    blocked: bool = False  # its last chunk found no room: it waits for room to come back (engine thread)
    marks: list[float] = field(default_factory=lambda: [time.perf_counter()])  # queued, started, prepared, done
    # Set by a requester that wants ``previous`` back if the request is dropped (a cancelled turn
    # keeps its session): resolved with the old base, or the spliced one if the splice had finished,
    # or ``None`` (consumed, or a splice cut half-way released it).
    returned: asyncio.Future[Handle | None] | None = None
    finish_once_spliced: bool = False  # cancelled after its splice finished, it still completes

    @property
    def gives_up(self) -> bool:
        """Whether a cancelled request is dropped now: yes, unless its splice has finished and its
        requester asked it to complete then (:attr:`finish_once_spliced`)."""
        spliced = self.prepare is None and self.splicing is None and self.job is not None
        return not (self.finish_once_spliced and spliced)

    def start(self, core: Any) -> bool:
        """Begin: the splice's first slice (if any); ``True`` once the prefill's chunks can begin."""
        self.marks.append(time.perf_counter())
        if self.prepare is not None:
            prepare, self.prepare = self.prepare, None
            self.splicing = prepare(self.previous)
        return self.advance(core)

    def advance(self, core: Any) -> bool:
        """The splice's next slice, then (once it is done) the cache matched: ``True`` when ready."""
        if self.splicing is not None:
            try:
                next(self.splicing)
                return False
            except StopIteration as done:
                self.splicing = None
                self.previous, self.report = done.value
            except BaseException:
                self.splicing, self.previous = None, None  # the splice released it, or left it to its owner
                raise
            self.marks.append(time.perf_counter())
        else:
            self.marks.append(self.marks[-1])
        self.job = core.start_prefill(self.tokens, self.scope, self.previous)
        self.note()
        return True

    def note(self) -> None:
        """Copy the job's progress to the requester's :class:`PrefillProgress` (after each chunk)."""
        job, progress = self.job, self.progress
        if job is not None and progress is not None:
            progress.total, progress.reused, progress.done = len(job.tokens), job.reused, job.done

    def timings(self) -> dict[str, float]:
        """Milliseconds waiting for the engine thread, splicing, and prefilling (chunks and waits between them)."""
        queued, started, prepared, done = (self.marks + [self.marks[-1]] * 4)[:4]
        return {"queue": (started - queued) * 1e3, "splice": (prepared - started) * 1e3,
                "prefill": (done - prepared) * 1e3}  # fmt: skip

    def finish(self, core: Any) -> None:
        """Cache the sequence and hand it back (or release it, if the requester has gone)."""
        assert self.job is not None
        try:
            result = core.finish_prefill(self.job)
        except BaseException as exc:  # noqa: BLE001 - the requester's
            self.job = None  # finish_prefill gave back what the job took
            self.fail(core, exc)
            return
        self.previous = None  # consumed
        self.marks.append(time.perf_counter())
        self.loop.call_soon_threadsafe(_resolve, self.future, (result, self.report), self.release)
        self._give_back(None)

    def fail(self, core: Any, exc: BaseException) -> None:
        """Give back what the request holds and hand the error to the requester."""
        self.drop(core)
        self.loop.call_soon_threadsafe(_reject, self.future, exc)

    def drop(self, core: Any) -> None:
        """Give back the job's KV and the handle it was to extend (the request is over)."""
        if self.splicing is not None:
            splicing, self.splicing = self.splicing, None
            splicing.close()  # the splice aborts its stage and releases the handle
            self.previous = None
        if self.job is not None:
            core.abort_prefill(self.job)
            self.job = None
        previous, self.previous = self.previous, None  # (no splice half-done here: it was closed above)
        if previous is not None and self.returned is None:
            core.release(previous)
            previous = None
        self._give_back(previous)

    def _give_back(self, previous: Handle | None) -> None:
        """Settle :attr:`returned` with the untouched old base (or ``None``): once, from any thread."""
        if self.returned is not None:
            returned, self.returned = self.returned, None
            self.loop.call_soon_threadsafe(_hand_back, returned, previous, self.release)


def _resolve(future: asyncio.Future[Any], value: tuple[Prefilled, Any], release: Callable[[Handle], None]) -> None:
    if future.done():  # the requester has gone: nobody else will release the new handle
        release(value[0].handle)
        return
    future.set_result(value)


def _hand_back(future: asyncio.Future[Any], handle: Handle | None, release: Callable[[Handle], None]) -> None:
    if future.done():  # the requester stopped waiting: nobody else will release it
        if handle is not None:
            release(handle)
        return
    future.set_result(handle)


def _reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


@dataclass(eq=False)
class Stream:
    """One turn's decoding: its job on the engine thread, its items on the consumer's loop."""

    handle: Handle
    last_logits: Logits
    params: SamplingParams
    processors: Processors | None
    key: str | None
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    job: DecodeJob | None = None
    generated: int = 0  # steps handed to the consumer's queue (engine thread)
    taken: int = 0  # steps the consumer took (event loop)
    closed: bool = False  # the consumer has gone (event loop)
    failed: bool = False
    last_step: int = -1  # the step it last decoded in

    def runnable(self, ahead: int) -> bool:
        """Whether the stream's next token can go into a step now."""
        job = self.job
        if job is None or self.closed or self.failed or job.finished or job.pending is None or job.retracted:
            return False
        return self.generated - self.taken < ahead

    def deliver(self, item: Any) -> None:
        """Hand a step, an error or the end to the consumer (from the engine thread)."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def pick_decodes(streams: Iterable[Stream], ahead: int, max_running: int, step: int) -> list[Stream]:
    """The streams that decode in step ``step``: every runnable one, or, past ``max_running``,
    keys in turn (each key's least recently stepped stream first)."""
    runnable = [s for s in streams if s.runnable(ahead)]
    if len(runnable) > max_running:
        by_key: dict[str | None, deque[Stream]] = {}
        for s in sorted(runnable, key=lambda s: s.last_step):
            by_key.setdefault(s.key, deque()).append(s)
        order = sorted(by_key, key=lambda k: by_key[k][0].last_step)
        runnable = []
        while len(runnable) < max_running:  # more runnable than max_running: never runs dry
            for k in order:
                if by_key[k] and len(runnable) < max_running:
                    runnable.append(by_key[k].popleft())
    for s in runnable:
        s.last_step = step
    return runnable


class Planned(NamedTuple):
    """A prefill request's chunk in the next step."""

    request: PrefillRequest
    tokens: int


def pick_chunks(
    queues: dict[str | None, deque[PrefillRequest]], served: dict[str | None, int], budget: int
) -> list[Planned]:
    """The prefill chunks of one step: the key served longest ago gets up to ``budget`` tokens of its
    oldest prefill; every other prefill joins only whole, while the budget lasts (each key's oldest
    first, keys in the same order, then the keys' later ones). Blocked prefills (no room) wait."""
    keys = [k for k, q in queues.items() if any(r.job is not None and not r.blocked for r in q)]
    keys.sort(key=lambda k: served.get(k, -1))
    ready = {k: [r for r in queues[k] if r.job is not None and not r.blocked] for k in keys}
    order = [ready[k][0] for k in keys] + [r for k in keys for r in ready[k][1:]]
    out: list[Planned] = []
    for request in order:
        assert request.job is not None
        left = request.job.left
        if not out:
            out.append(Planned(request, min(left, budget)))
            budget -= out[-1].tokens
        elif left <= budget:
            out.append(Planned(request, left))
            budget -= left
    return out
