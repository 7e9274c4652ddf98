"""Asyncio front of the embedded engine: all model work on one worker thread.

Every engine call is a job on a single-thread executor, and decoding submits one job per token,
so concurrent requests from many sessions interleave step by step (first come, first served per
step). Closing a stream early (client gone, request cancelled) stops decoding after the current
step and commits what was generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from leyline_server.engines.embedded.engine import Engine, GenerationStep, Pinned, SamplingParams

__all__ = ["AsyncEngine"]

T = TypeVar("T")


class AsyncEngine:
    """Runs an :class:`Engine` on its own thread behind ``async`` methods."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leyline-engine")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the engine thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` on the engine thread without waiting (e.g. releasing a pin)."""
        self._executor.submit(fn, *args)

    async def stream(
        self, pinned: Pinned, logits: torch.Tensor, params: SamplingParams
    ) -> AsyncIterator[GenerationStep]:
        """Decode after ``pinned``, one engine job per token."""
        steps = self.engine.decode(pinned, logits, params)
        try:
            while True:
                step = await self.call(next, steps, None)
                if step is None:
                    return
                yield step
        finally:
            await asyncio.shield(self.call(steps.close))

    def shutdown(self) -> None:
        """Finish queued jobs and stop the worker thread."""
        self._executor.shutdown(wait=True)
