"""The engine thread of the CPU engines: steps batched across streams, prefills chunked, keys taking turns.

In the shape of vLLM's and SGLang's schedulers, on one thread that owns the engine core
(:class:`~leyline_server.contract.base.SyncCore`). Its loop, each round:

1. **jobs** — atomic calls (a release, a session's bookkeeping, :meth:`Scheduler.call`) queued
   before the round began run first, first come first served;
2. **admissions** — new prefills are started (a turn's splice first: one atomic job), new streams
   sample their first token from their prefill's logits;
3. **one step** — one ``core.forward`` over

   * the next token of every running stream (at most ``max_running``; past that, keys take turns
     and each key's streams take turns), and
   * prefill chunks: keys take turns (the key whose prefill was served longest ago first); its
     oldest prefill gets a chunk of up to ``chunk_size`` tokens less the step's decode tokens (at
     least ``MIN_CHUNK``), and other keys' prefills join the same step only whole and only while
     they fit.

   Then every stream in the step samples its next token and hands it to its consumer; a prefill
   whose last chunk ran is finished and handed back.

**Bounds.** A step costs at most ``chunk_size`` prefill tokens plus one token per running stream.
So a running stream gets a token every step, and a key's prefill gets a chunk within as many
steps as there are other keys with prefills waiting (a short prompt: its whole prefill). A long
prefill therefore delays another key's first token by about one chunk, and its own by about one
short step per other key.

**Run-ahead.** A stream decodes at most ``ahead`` tokens past what its consumer has taken; then it
sits out of the steps until the consumer catches up (a client that stops reading costs nothing).
Closing a stream (finished, client gone, cancelled) is an atomic job: the core keeps the tokens
the consumer received and drops the KV of any decoded ahead. A prefill whose requester has gone
is aborted before its next chunk (or its result released, if it had finished).

**Room.** The pool's room goes to the running streams' next tokens first. When a step's decodes
find none, a running stream is *retracted* (:mod:`.retraction`: its KV given back, resumed
later, served before new prefills, answering the same tokens); a prefill chunk that finds no room
retracts a stream that sits out for its reader, else tries again while streams decode (their room
comes back as they end or are retracted), and fails as before (the service sheds idle cache and
retries it) when none does.

Everything the core touches runs on this thread; the event loop only queues work and reads
results (``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from leyline_server.contract.jobs import Chunk, DecodeJob
from leyline_server.contract.values import CapacityError, GenerationStep
from leyline_server.engines.retraction import Retractions, victim
from leyline_server.engines.scheduling import Planned, PrefillRequest, Stream, pick_chunks, pick_decodes

__all__ = ["Scheduler", "RUN_AHEAD", "CHUNK_SIZE", "MAX_RUNNING", "MIN_CHUNK", "END"]

T = TypeVar("T")
log = logging.getLogger("leyline.engine")
RUN_AHEAD = 16  # tokens a stream may decode past what its consumer has taken
CHUNK_SIZE = 256  # prefill tokens per step (SGLang's --chunked-prefill-size)
MAX_RUNNING = 64  # streams decoding in one step (SGLang's --max-running-requests)
MIN_CHUNK = 16  # a prefill's chunk is never squeezed below this by many streams
END = object()  # a stream's last item: decoding ended without a step saying so (max_tokens 0, shutdown)


class Scheduler:
    """The engine thread (see the module docstring); ``core`` is used from this thread only."""

    def __init__(
        self,
        core: Any,
        name: str = "leyline-engine",
        chunk_size: int = CHUNK_SIZE,
        max_running: int = MAX_RUNNING,
        ahead: int = RUN_AHEAD,
    ) -> None:
        if chunk_size < 1 or max_running < 1 or ahead < 1:
            raise ValueError("chunk_size, max_running and ahead must be positive")
        self.core = core
        self.chunk_size, self.max_running, self.ahead = chunk_size, max_running, ahead
        self._cv = threading.Condition()
        self._jobs: list[Callable[[], None]] = []
        self._new_prefills: list[PrefillRequest] = []
        self._new_streams: list[Stream] = []
        self._stopping = False
        self._prefills: dict[str | None, deque[PrefillRequest]] = {}
        self._streams: list[Stream] = []
        self._served: dict[str | None, int] = {}  # key -> the step its prefill was last served in
        self.retractions = Retractions(core)
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def served_at(self, key: str | None) -> int | None:
        """The step that last ran a prefill chunk of ``key`` (``None``: never)."""
        return self._served.get(key)

    # -- from the event loop (or any thread) ----------------------------------------------------------
    def _queue(self, job: Callable[[], None]) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine has shut down")
            self._jobs.append(job)
            self._cv.notify()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread between steps and wait for it."""
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        self._queue(job)
        return await asyncio.wrap_future(future)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` without waiting (e.g. releasing a handle); safe from any thread."""
        try:
            self._queue(lambda: fn(*args))
        except RuntimeError:  # shut down: nothing left to release into
            pass

    def prefill(self, request: PrefillRequest) -> None:
        """Queue a prefill (its ``future`` answers, on its loop)."""
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine has shut down")
            self._new_prefills.append(request)
            self._cv.notify()

    def open_stream(self, stream: Stream) -> None:
        """Start decoding ``stream`` (its items arrive in ``stream.queue``, on its loop)."""
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine has shut down")
            self._new_streams.append(stream)
            self._cv.notify()

    def poke(self) -> None:
        """Wake the thread: a consumer took a token (its stream may run again), or gave up a prefill."""
        with self._cv:
            self._cv.notify()

    async def close_stream(self, stream: Stream, delivered: int) -> None:
        """End ``stream``, keeping its first ``delivered`` tokens; waits until the core has done so."""
        stream.closed = True
        await self.call(self._finish_stream, stream, delivered)

    def shutdown(self) -> None:
        """Run the queued jobs, fail what is in flight, stop the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._jobs or self._new_prefills or self._new_streams or self._ready()):
                    patience = self.retractions.patience(bool(self._streams))
                    if not self._cv.wait(patience) and patience is not None:
                        self.retractions.try_again()  # a retracted stream waits for room, nothing runs
                jobs, self._jobs = self._jobs, []
                prefills, self._new_prefills = self._new_prefills, []
                streams, self._new_streams = self._new_streams, []
                stopping = self._stopping
            for job in jobs:
                _guarded(job)
            if jobs:  # (releases among them: room may have come back)
                self._came_back()
            if stopping:
                _guarded(self._fail_all, prefills, streams)
                return
            for request in prefills:
                _guarded(self._admit_prefill, request)
            for stream in streams:
                _guarded(self._admit_stream, stream)
            _guarded(self._splice_slices)
            _guarded(self.retractions.start)
            _guarded(self._step)

    def _ready(self) -> bool:
        """Whether a step has something to do (called with the lock held)."""
        for r in (r for q in self._prefills.values() for r in q):
            if r.cancelled or r.splicing or (r.job is not None and not r.blocked):
                return True
        return self.retractions.ready() or any(s.runnable(self.ahead) for s in self._streams)

    def _came_back(self) -> None:
        """Room came back to the pool: blocked prefills and the resume may try again."""
        for request in (r for q in self._prefills.values() for r in q):
            request.blocked = False
        self.retractions.came_back()

    def _admit_prefill(self, request: PrefillRequest) -> None:
        if request.cancelled:
            request.drop(self.core)
            return
        self._prefills.setdefault(request.key, deque()).append(request)
        self._advance(request, request.start)

    def _advance(self, request: PrefillRequest, how: Callable[[Any], bool]) -> None:
        """One slice of ``request``'s splice (or its start); a failure is the requester's."""
        try:
            how(self.core)
        except BaseException as exc:  # noqa: BLE001 - the requester's error (a strict splice, capacity)
            self._remove(request)
            request.fail(self.core, exc)

    def _splice_slices(self) -> None:
        """Every splice in progress takes its next slice (a replacement's next chunk)."""
        for request in [r for q in self._prefills.values() for r in q if r.splicing is not None]:
            if not request.cancelled:
                self._advance(request, request.advance)

    def _admit_stream(self, stream: Stream) -> None:
        if stream.closed:  # its consumer went before it started (its close job found nothing to do)
            return
        try:
            stream.job = self.core.start_decode(stream.handle, stream.last_logits, stream.params, stream.processors)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            stream.deliver(exc)
            return
        self._streams.append(stream)
        if stream.job.finished:
            stream.deliver(END)
        else:
            self._sample(stream)

    def _sample(self, stream: Stream) -> None:
        job: DecodeJob | None = stream.job
        assert job is not None
        try:
            step: GenerationStep = self.core.sample(job)
        except BaseException as exc:  # noqa: BLE001 - a grammar's error is this stream's
            stream.failed = True
            stream.deliver(exc)
            return
        stream.generated += 1
        stream.deliver(step)

    def _finish_stream(self, stream: Stream, delivered: int) -> None:
        if stream in self._streams:
            self._streams.remove(stream)
        self.retractions.drop(stream)
        if stream.job is not None:
            self.core.finish_decode(stream.job, delivered)
        self._came_back()

    def _step(self) -> None:
        """One forward: the running streams' next tokens and the chunks chosen (module docstring)."""
        self._drop_cancelled()
        decodes = pick_decodes(self._streams, self.ahead, self.max_running, self.steps)
        budget = max(self.chunk_size - len(decodes), MIN_CHUNK)
        resume = self.retractions.resume  # a retracted stream's context goes before new prefills
        mine = min(resume.job.left, budget) if resume is not None and not resume.blocked else 0
        chunks = pick_chunks(self._prefills, self._served, budget - mine) if budget > mine else []
        if not decodes and not chunks and not mine:
            return
        self.steps += 1
        for chunk in chunks:
            self._served[chunk.request.key] = self.steps
        work = [Chunk(c.request.job, c.tokens) for c in chunks if c.request.job is not None]
        if resume is not None and mine:
            work.insert(0, Chunk(resume.job, mine))
        try:
            failures = self.core.forward(work, [s.job for s in decodes])
        except BaseException as exc:  # noqa: BLE001 - a failed forward fails everyone in it
            failures = {c.job: exc for c in work} | {s.job: exc for s in decodes}
        if resume is not None and mine:
            self._after_resume(failures.get(resume.job))
        self._after_decodes(decodes, failures)
        self._after_chunks(chunks, failures)

    def _after_decodes(self, decodes: list[Stream], failures: dict[object, BaseException]) -> None:
        """Sample the streams that stepped; a stream without room makes one retraction."""
        short = []
        for stream in decodes:
            failure = failures.get(stream.job)
            if isinstance(failure, CapacityError):
                short.append(stream)
            elif failure is not None:
                stream.failed = True
                stream.deliver(failure)
            else:
                self._sample(stream)
        if short:
            self._make_room(short)

    def _make_room(self, short: list[Stream]) -> None:
        """Retract one running stream (:func:`~.retraction.victim`); the last one only for prefill
        work in progress that holds room, else the streams without room fail (503 ``capacity``)."""
        running = self._holding()
        held = any(r.job is not None and r.job.done > r.job.reused for q in self._prefills.values() for r in q)
        if len(running) > 1 or (running and (held or self.retractions.resume is not None)):
            self._retract(victim(running, self.ahead))
            return
        for stream in short:
            stream.failed = True
            stream.deliver(CapacityError(f"the KV pool ({self.core.info.kv_capacity_tokens} tokens) is full"))

    def _after_resume(self, failure: BaseException | None) -> None:
        """The resumed stream decodes again; a resume without room retracts a stream that sits out
        for its reader, else tries again while streams decode, or waits for room to come back."""
        holding = self._holding()
        back = self.retractions.advanced(failure, retry=bool(holding))
        if back is not None:
            self._streams.append(back)
        elif isinstance(failure, CapacityError) and (paused := [s for s in holding if not s.runnable(self.ahead)]):
            self._retract(victim(paused, self.ahead))

    def _holding(self) -> list[Stream]:
        """The streams holding KV that a retraction could give back (sampled, not ended)."""
        return [s for s in self._streams if s.job is not None and s.job.pending is not None and not s.failed]

    def _retract(self, stream: Stream) -> None:
        self._streams.remove(stream)
        self.retractions.retract(stream)
        self._came_back()
        self.retractions.freed = False  # (room a retraction frees is not for resuming)

    def _after_chunks(self, chunks: list[Planned], failures: dict[object, BaseException]) -> None:
        """Finish the prefills whose last chunk ran. One without room retracts a stream that sits
        out for its reader, if there is one; else it tries again while streams decode, waits for
        ended streams to close, and fails when there are none."""
        holding = self._holding()
        paused = [s for s in holding if not s.runnable(self.ahead)]
        for chunk in chunks:
            request = chunk.request
            request.note()
            failure = failures.get(request.job)
            if isinstance(failure, CapacityError) and paused:
                self._retract(victim(paused, self.ahead))  # (the prefill tries again next step)
                paused = [s for s in paused if s.job is not None and not s.job.retracted]
            elif isinstance(failure, CapacityError) and holding:
                pass  # the streams decode (each step), then end or pause: it tries again next step
            elif isinstance(failure, CapacityError) and self._streams:
                request.blocked = True  # ended streams not closed yet: until their close
            elif failure is not None:
                self._remove(request)
                request.fail(self.core, failure)
            elif request.job is not None and not request.job.left:
                self._remove(request)
                request.finish(self.core)

    def _remove(self, request: PrefillRequest) -> None:
        queue = self._prefills.get(request.key)
        if queue is not None and request in queue:
            queue.remove(request)
            if not queue:
                del self._prefills[request.key]

    def _drop_cancelled(self) -> None:
        for request in [r for q in self._prefills.values() for r in q if r.cancelled and r.gives_up]:
            self._remove(request)
            request.drop(self.core)
            self._came_back()

    def _fail_all(self, prefills: list[PrefillRequest], streams: list[Stream]) -> None:
        gone = RuntimeError("the engine has shut down")
        for request in [*prefills, *(r for q in self._prefills.values() for r in q)]:
            request.fail(self.core, gone)
        self._prefills.clear()
        retracted = self.retractions.all()
        for stream in retracted:
            self.retractions.drop(stream)
        for stream in [*streams, *self._streams, *retracted]:
            stream.deliver(gone)
            if stream.job is not None:
                self.core.finish_decode(stream.job, stream.taken)
        self._streams.clear()


def _guarded(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn``; an exception is logged, never allowed to end the engine thread (a dead thread
    would leave every request waiting for good)."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - logged: the requester's own error reached it already
        log.exception("the engine thread caught an error and goes on")
