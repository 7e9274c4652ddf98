"""One worker thread that runs every engine job, behind ``async`` methods.

Every engine call is a job on a single-thread executor, and decoding submits one job per token,
so concurrent requests from many sessions interleave step by step (first come, first served per
step). Closing a stream early (client gone, request cancelled) stops decoding after the current
step; the generator's own ``finally`` then runs on the worker thread too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["Worker"]

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
