"""The SGLang engine behind the service-facing :class:`~leyline_server.contract.base.Engine` protocol.

Splices and prefills run the executor on worker threads (each blocks on round trips to the
schedulers, so several sessions proceed at once); decoding is SGLang's own streaming request,
consumed on the caller's event loop. SGLang admits a generation only with room for all of its
``max_tokens`` up front; a stream that would not fit raises ``CapacityError`` before it starts
(SGLang would queue it for as long as pinned sessions hold the pool). After a stream the turn's
handle is re-pinned on what SGLang cached (prompt + generated but the last token, which has no KV
yet), as the embedded engine does.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

import anyio

from leyline_server.contract.values import (
    CacheScope,
    Constraint,
    GenerationStep,
    Handle,
    ModelInfo,
    PrefillProgress,
    SamplingParams,
    SpliceRequest,
    Turn,
)
from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET
from leyline_server.engines.sglang.backend import SGLangHandle, SGLangSpliceBackend, Transport
from leyline_server.engines.sglang.sampling import StepReader, logprob_args, sampling_dict
from leyline_server.engines.turn_job import run_turn
from leyline_server.splice import SpliceReport, splice

__all__ = ["AsyncSGLangEngine", "Client"]

T = TypeVar("T")


class Client(Transport, Protocol):
    """A :class:`Transport` that also streams generations and can be closed."""

    def generate(
        self, tokens: list[int], ns: str | None, sampling: dict[str, Any], extra: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """SGLang's stream chunks for a generation after ``tokens``."""
        ...

    def close(self) -> None:
        """Stop talking to SGLang."""
        ...


class AsyncSGLangEngine:
    """:class:`SGLangSpliceBackend` and SGLang's streaming, as an :class:`~leyline_server.contract.base.Engine`.

    ``shutdown`` stops SGLang's processes on :meth:`close`.
    """

    def __init__(
        self,
        client: Client,
        info: ModelInfo,
        shutdown: Callable[[], None] = lambda: None,
        rotation_budget: int = DEFAULT_ROTATION_BUDGET,
        canary_tolerance: float | None = None,
        workers: int = 8,
    ) -> None:
        self.client = client
        self.backend = SGLangSpliceBackend(client, info, rotation_budget, canary_tolerance)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="leyline-sglang")
        self._shutdown = shutdown

    @property
    def info(self) -> ModelInfo:
        """The served model."""
        return self.backend.info

    async def _job(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def open(self, tokens: Sequence[int], scope: CacheScope, owner: str | None = None) -> Handle:
        """Prefill ``tokens`` through SGLang and pin them (SGLang's own scheduler orders the work)."""
        result = await self._job(self.backend.prefill, list(tokens), scope)
        return result.handle

    async def start_turn(
        self,
        prompt: Sequence[int],
        scope: CacheScope,
        session: Handle | None,
        request: SpliceRequest | None,
        owner: str | None = None,
        progress: PrefillProgress | None = None,
    ) -> Turn:
        """Splice ``session`` if asked, then prefill ``prompt`` (``session`` is consumed as on the
        embedded engine; SGLang's own scheduler orders the work, ``owner`` is not used; ``progress``
        gets the prompt's length only: SGLang does not say how far a prefill has come)."""
        if progress is not None:
            progress.total = len(prompt)
        return await self._job(run_turn, self.backend, prompt, scope, session, request)

    async def check_constraint(self, constraint: Constraint) -> None:
        """Nothing to check here: SGLang compiles the constraint itself and aborts a request whose
        grammar it cannot build (the stream then fails with SGLang's message)."""

    def constraint_ready(self, constraint: Constraint) -> bool:
        """Always: nothing is compiled here."""
        return True

    def stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        """Decode after ``turn`` with SGLang; ``turn.handle`` ends pinned on prompt + generated."""
        return self._stream(turn, params)

    async def _stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        if params.max_tokens == 0:
            return
        handle = SGLangHandle.of(turn.handle)
        await self._job(self.backend.check_decode_room, turn.prompt, handle.ns, params.max_tokens)
        reader = StepReader()
        chunks = self.client.generate(list(turn.prompt), handle.ns, sampling_dict(params), logprob_args(params))
        try:
            async with aclosing(chunks) as stream:  # type: ignore[type-var]
                async for chunk in stream:
                    for step in reader.steps(chunk):
                        turn.generated.append(step.token)
                        yield step
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled stream still re-pins before it ends
                await self._repin(turn)

    async def _repin(self, turn: Turn) -> None:
        old = turn.handle
        turn.handle = await self._job(self.backend.pin, turn.prompt + turn.generated, old.scope)
        self.backend.release(old)

    async def splice(self, handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
        """Apply directives without generating."""
        return await self._job(splice, self.backend, handle, request)

    def release(self, handle: Handle) -> None:
        """Unpin ``handle`` (posted to the schedulers; never blocks)."""
        self.backend.release(handle)

    async def close(self) -> None:
        """Finish the worker threads, stop the client and SGLang's processes."""
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        self.client.close()
        self._shutdown()
