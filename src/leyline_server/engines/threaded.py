"""Engines whose model runs synchronously on one thread (embedded, llama.cpp) behind the async protocol.

:class:`Worker` is the thread: every engine call is a job on a single-thread queue. Decoding
*runs ahead* of the consumer (:meth:`Worker.run_ahead`): one job takes decode steps back to back
and hands each to the event loop as soon as it exists, so neither the thread hop nor the
consumer's own work (detokenizing, SSE) sits between two decode steps. As soon as another job is
waiting (a new request's prefill, another stream's step) the run gives the thread up after the
current step and queues itself again behind it, so concurrent requests still interleave step by
step, first come first served; it pauses when ``ahead`` steps have not been taken by the
consumer yet, and the consumer restarts it once it has caught up. Closing a stream early (client
gone, stop string, cancelled request) stops the run after the current step; the core's decode
generator is then closed on the worker thread and commits only the steps the consumer received
(the KV of steps decoded ahead is dropped again). :class:`ThreadedEngine` puts a synchronous core
behind :class:`~leyline_server.engines.base.Engine`: a turn's splice + prefill is one job.

Constrained decoding (``engines.grammar``) runs inside the decode generator as a logits processor:
the grammar advances on every token the generator samples, decoded ahead or not, and is dropped
with the generator when the turn ends. What is committed is the delivered prefix, which the
grammar accepted first; nothing of a grammar outlives its turn, so a later turn (after a splice or
not) starts from the grammar's beginning exactly like a fresh request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, Generic, TypeVar

import anyio

from leyline_server.engines.base import StageT, SyncCore
from leyline_server.engines.grammar import GrammarBackend
from leyline_server.engines.logits import LogitsProcessor, Processors, SuppressUntil
from leyline_server.engines.turn_job import run_turn
from leyline_server.engines.values import (
    CacheScope,
    Constraint,
    ConstraintError,
    GenerationStep,
    Handle,
    ModelInfo,
    SamplingParams,
    SpliceRequest,
    Turn,
)
from leyline_server.splice import SpliceReport, splice

__all__ = ["Worker", "ThreadedEngine", "RUN_AHEAD", "COMPILE_THREADS"]

T = TypeVar("T")
RUN_AHEAD = 16  # decode steps a stream may compute before its consumer takes them
COMPILE_THREADS = 4  # grammars compiling at once (one per key: ``api.compiles``)
_MORE = object()  # a run-ahead job gave the thread up: the consumer queues the next one


class Worker:
    """A single engine thread: ``call`` (await a job), ``submit`` (fire and forget), ``run_ahead``."""

    def __init__(self, name: str = "leyline-engine") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._waiting = 0

    @property
    def contended(self) -> bool:
        """Whether a job is queued behind the running one (a long job should give the thread up)."""
        return self._waiting > 0

    def _queue(self, fn: Callable[[], T]) -> Future[T]:
        def job() -> T:
            with self._lock:
                self._waiting -= 1
            return fn()

        with self._lock:
            self._waiting += 1
        try:
            return self._executor.submit(job)
        except BaseException:
            with self._lock:
                self._waiting -= 1
            raise

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the worker thread and wait for it."""
        return await asyncio.wrap_future(self._queue(lambda: fn(*args, **kwargs)))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` without waiting (e.g. releasing a handle); safe from any thread."""
        try:
            self._queue(lambda: fn(*args))
        except RuntimeError:  # shut down: nothing left to release into
            pass

    async def run_ahead(
        self, steps: Generator[T, None, None], last: Callable[[T], bool], ahead: int = RUN_AHEAD
    ) -> AsyncGenerator[T, None]:
        """Yield ``steps`` computed on the worker ahead of the consumer (see the module docstring).

        ``last(step)``: the generator is not resumed after such a step, so that closing it (which
        commits) always happens after the consumer's last ``next``. Closing this iterator closes
        ``steps`` on the worker; an exception from a step is raised here after the steps before it.
        """
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[Any] = asyncio.Queue()
        stopped = threading.Event()
        budget = [ahead]  # steps the worker may still make before the consumer catches up

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(out.put_nowait, item)

        def run() -> None:
            while budget[0] > 0 and not stopped.is_set():
                try:
                    step = next(steps, None)
                    budget[0] -= 1
                    put(step)
                    if step is None or last(step):
                        return
                    if self.contended:  # the waiting job first; this run goes on behind it
                        self._queue(run)
                        return
                except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                    put(exc)
                    return
            if not stopped.is_set():
                put(_MORE)  # every step so far is in ``out``: the consumer restarts the run

        try:
            self._queue(run)
            while True:
                item = await out.get()
                if item is _MORE:
                    budget[0] = ahead  # no run is queued or running now
                    self._queue(run)
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if last(item):
                    return
        finally:
            stopped.set()
            with anyio.CancelScope(shield=True):  # a cancelled stream still commits before it ends
                await self.call(steps.close)

    def shutdown(self) -> None:
        """Finish queued jobs and stop the thread."""
        self._executor.shutdown(wait=True)


class ThreadedEngine(Generic[StageT]):
    """A synchronous engine core on its own thread, as an :class:`~leyline_server.engines.base.Engine`.

    ``core`` is a :class:`~leyline_server.engines.base.SyncCore`: the splice primitives plus
    ``decode(handle, state, params, delivered, processors)`` (a generator of
    :class:`GenerationStep` that, when closed, commits the first ``delivered()`` tokens it
    generated) and ``close()``. ``tokenizer`` (a transformers tokenizer) is what constraints are
    compiled for.
    """

    def __init__(self, core: SyncCore[StageT], tokenizer: object = None, name: str = "leyline-engine") -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.worker = Worker(name)
        self._grammar: GrammarBackend | None = None
        self._compiles = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix=f"{name}-compile")

    @property
    def grammar(self) -> GrammarBackend:
        """The constraint compiler for this engine's tokenizer (built on first use)."""
        if self._grammar is None:
            if self.tokenizer is None:
                raise ConstraintError("this engine has no tokenizer to compile constraints for")
            info = self.core.info
            self._grammar = GrammarBackend(self.tokenizer, info.vocab_size, info.eos_token_ids)
        return self._grammar

    async def check_constraint(self, constraint: Constraint) -> None:
        """Compile ``constraint`` on a compile thread (cached for the turn); :class:`ConstraintError` if impossible.

        The compile threads are the engine's own (``COMPILE_THREADS``), apart from the event loop's
        default executor, so that compiles never delay other work handed to threads.
        """
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._compiles, self.grammar.compile, constraint)

    def constraint_ready(self, constraint: Constraint) -> bool:
        """Whether ``constraint``'s grammar is compiled already."""
        return self._grammar is not None and self._grammar.cached(constraint)

    def processors(self, params: SamplingParams) -> Processors | None:
        """The logits processors ``params`` ask for: ``min_tokens``, then the constraint's grammar."""
        items: list[LogitsProcessor] = []
        if params.min_tokens:
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.core.info.eos_token_ids))
            items.append(SuppressUntil(stops, params.min_tokens))
        if params.constraint is not None:
            items.append(self.grammar.mask(params.constraint))
        return Processors(items) if items else None

    @property
    def info(self) -> ModelInfo:
        """The served model."""
        return self.core.info

    async def open(self, tokens: Sequence[int], scope: CacheScope) -> Handle:
        """Prefill ``tokens`` and pin them."""
        result = await self.worker.call(self.core.prefill, list(tokens), scope)
        return result.handle

    async def start_turn(
        self, prompt: Sequence[int], scope: CacheScope, session: Handle | None, request: SpliceRequest | None
    ) -> Turn:
        """Splice ``session`` if asked, then prefill ``prompt`` (one engine job).

        ``session`` is consumed unless ``SpliceError`` is raised; after any other error it has
        been released.
        """

        return await self.worker.call(run_turn, self.core, prompt, scope, session, request)

    def stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        """Decode after ``turn``, running ahead of the consumer; ``turn.handle`` ends as prompt + delivered.

        A step counts as delivered once this iterator yielded it (``turn.generated``); steps
        decoded ahead and never taken are not committed.
        """
        return self._stream(turn, params)

    async def _stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        processors = self.processors(params)
        decode = self.core.decode(turn.handle, turn.last_logits, params, lambda: len(turn.generated), processors)
        async with aclosing(self.worker.run_ahead(decode, _finished)) as steps:
            async for step in steps:
                turn.generated.append(step.token)
                yield step

    async def splice(self, handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
        """Apply directives without generating."""
        return await self.worker.call(splice, self.core, handle, request)

    def release(self, handle: Handle) -> None:
        """Unpin ``handle`` on the engine thread (never blocks)."""
        self.worker.submit(self.core.release, handle)

    async def close(self) -> None:
        """Stop the engine thread (queued releases run first), then let the core free its memory."""
        self.worker.shutdown()
        self._compiles.shutdown(wait=False, cancel_futures=True)  # a compile in flight ends on its own
        self.core.close()


def _finished(step: GenerationStep) -> bool:
    return step.finish_reason is not None
