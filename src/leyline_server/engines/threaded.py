"""Engines whose model runs synchronously on one thread (embedded, llama.cpp) behind the async protocol.

:class:`Worker` is the thread: every engine call is a job on a single-thread executor, and
decoding submits one job per token, so concurrent requests from many sessions interleave step by
step (first come, first served per step). Closing a stream early (client gone, request
cancelled) stops decoding after the current step; the generator's own ``finally`` then runs on
the worker thread too. :class:`ThreadedEngine` puts a synchronous core behind
:class:`~leyline_server.engines.base.Engine`: a turn's splice + prefill is one job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, TypeVar

from leyline_server.engines.base import (
    CacheScope,
    GenerationStep,
    Handle,
    ModelInfo,
    SamplingParams,
    SpliceRequest,
    Turn,
)
from leyline_server.splice import SpliceReport, splice

__all__ = ["Worker", "ThreadedEngine"]

T = TypeVar("T")


class Worker:
    """A single engine thread with ``call`` (await a job), ``submit`` (fire and forget), ``iterate``."""

    def __init__(self, name: str = "leyline-engine") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the worker thread and wait for it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` without waiting (e.g. releasing a handle); safe from any thread."""
        try:
            self._executor.submit(fn, *args)
        except RuntimeError:  # shut down: nothing left to release into
            pass

    async def iterate(self, steps: Generator[T, None, None]) -> AsyncGenerator[T, None]:
        """Drive a generator one ``next`` per job; closing the iterator closes it on the worker."""
        try:
            while True:
                step = await self.call(next, steps, None)
                if step is None:
                    return
                yield step
        finally:
            await asyncio.shield(self.call(steps.close))

    def shutdown(self) -> None:
        """Finish queued jobs and stop the thread."""
        self._executor.shutdown(wait=True)


class ThreadedEngine:
    """A synchronous engine core on its own thread, as an :class:`~leyline_server.engines.base.Engine`.

    ``core`` implements :class:`~leyline_server.engines.base.SpliceBackend` plus
    ``decode(handle, state, params)`` (a generator of :class:`GenerationStep`, committing what it
    generated when closed) and optionally ``close()``.
    """

    def __init__(self, core: Any, tokenizer: object = None, name: str = "leyline-engine") -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.worker = Worker(name)

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

        def job() -> Turn:
            handle, report = session, None
            if handle is not None and request is not None and request.directives:
                handle, report = splice(self.core, handle, request)
            try:
                result = self.core.prefill(prompt, scope, previous=handle)
            except BaseException:
                if handle is not None:
                    self.core.release(handle)
                raise
            return Turn(result.handle, list(prompt), report, result.reused, result.approximate, result.state)

        return await self.worker.call(job)

    def stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        """Decode after ``turn``, one job per token; ``turn.handle`` ends as prompt + generated."""
        return self._stream(turn, params)

    async def _stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        async with aclosing(self.worker.iterate(self.core.decode(turn.handle, turn.state, params))) as steps:
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
        close = getattr(self.core, "close", None)
        if close is not None:
            close()
