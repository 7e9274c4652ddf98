"""The llama.cpp engine behind the service-facing :class:`~leyline_server.engines.base.Engine` protocol.

All llama.cpp work runs on one :class:`~leyline_server.engines.embedded.worker.Worker` thread (a
context is not thread-safe): a turn's splice + prefill is one job, decoding one job per token, so
requests from many sessions interleave step by step, as on the embedded engine.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from leyline_server.engines.base import (
    CacheScope,
    GenerationStep,
    Handle,
    ModelInfo,
    SamplingParams,
    SpliceRequest,
    Turn,
)
from leyline_server.engines.embedded.worker import Worker
from leyline_server.engines.llamacpp.engine import LlamaCppEngine
from leyline_server.splice import SpliceReport, splice

__all__ = ["AsyncLlamaCppEngine"]


class AsyncLlamaCppEngine:
    """:class:`LlamaCppEngine` on its own thread, as an :class:`~leyline_server.engines.base.Engine`."""

    def __init__(self, core: LlamaCppEngine, tokenizer: object = None) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.worker = Worker("leyline-llamacpp")

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
        """Stop the engine thread (queued releases run first), then free llama.cpp's memory."""
        self.worker.shutdown()
        self.core.close()
