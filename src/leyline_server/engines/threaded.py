"""Engines whose model runs synchronously on one thread (embedded, llama.cpp) behind the async protocol.

:class:`ThreadedEngine` puts a synchronous core (:class:`~leyline_server.contract.base.SyncCore`)
behind :class:`~leyline_server.contract.base.Engine`. Its thread is a
:class:`~leyline_server.engines.scheduler.Scheduler`: running streams decode together in one
batched forward per step, prefills are cut into chunks that share those steps, keys take turns,
and a stream decodes at most ``RUN_AHEAD`` tokens past what its consumer has taken. A turn's
splice is one atomic job on that thread, run just before its prefill's chunks.

Constrained decoding (``engines.grammar``) runs inside each stream's sampling as a logits
processor: the grammar advances on every token the stream samples, decoded ahead or not, and is
dropped with the stream when the turn ends. What is committed is the delivered prefix, which the
grammar accepted first; nothing of a grammar outlives its turn, so a later turn (after a splice or
not) starts from the grammar's beginning exactly like a fresh request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic

import anyio

from leyline_server.contract.base import StageT, SyncCore
from leyline_server.contract.logits import LogitsProcessor, Processors, SuppressUntil
from leyline_server.contract.values import (
    CacheScope,
    Constraint,
    ConstraintError,
    GenerationStep,
    Handle,
    ModelInfo,
    Prefilled,
    PrefillProgress,
    SamplingParams,
    SpliceRequest,
    Turn,
    set_kept,
)
from leyline_server.engines.grammar import GrammarBackend
from leyline_server.engines.scheduler import END, RUN_AHEAD, Scheduler
from leyline_server.engines.scheduling import PrefillRequest, Stream
from leyline_server.splice import SpliceReport, settle_forget, splice, splice_for_turn

__all__ = ["ThreadedEngine", "RUN_AHEAD", "COMPILE_THREADS"]

RETURN_WAIT_S = 60.0  # how long a cancelled turn waits for the engine thread to hand its old base back
COMPILE_THREADS = 4  # grammars compiling at once (one per key: ``api.compiles``)


class ThreadedEngine(Generic[StageT]):
    """A synchronous engine core on its own thread, as an :class:`~leyline_server.contract.base.Engine`.

    ``core`` is a :class:`~leyline_server.contract.base.SyncCore`: the splice primitives plus the
    batched steps the scheduler drives, and ``close()``. ``tokenizer`` (a transformers tokenizer)
    is what constraints are compiled for.
    """

    def __init__(
        self, core: SyncCore[StageT], tokenizer: object = None, name: str = "leyline-engine", **scheduling: Any
    ) -> None:
        """``scheduling``: the :class:`Scheduler`'s ``chunk_size``, ``max_running`` and ``ahead``."""
        self.core = core
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(core, name, **scheduling)
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
    def retractions(self) -> int:
        """Streams retracted since start (``leyline_retractions`` in ``/metrics``)."""
        return self.scheduler.retractions.total

    @property
    def info(self) -> ModelInfo:
        """The served model."""
        return self.core.info

    async def open(self, tokens: Sequence[int], scope: CacheScope, owner: str | None = None) -> Handle:
        """Prefill ``tokens`` and pin them (in chunks, like a turn's prompt)."""
        prefilled, _, _ = await self._prefill(list(tokens), scope, None, owner, None)
        return prefilled.handle

    async def start_turn(
        self,
        prompt: Sequence[int],
        scope: CacheScope,
        session: Handle | None,
        request: SpliceRequest | None,
        owner: str | None = None,
        progress: PrefillProgress | None = None,
    ) -> Turn:
        """Splice ``session`` if asked (one atomic job), then prefill ``prompt`` in chunks.

        ``session`` is consumed unless ``SpliceError`` is raised; after any other error it has
        been released. ``owner``: the key whose turn it is (keys take turns between steps);
        ``progress``: updated after each chunk. A cancelled call gives the prefill up before its
        next chunk (:meth:`_prefill`).
        """
        prepare = None
        if session is not None and request is not None and request.directives:
            core, chunk = self.core, self.scheduler.chunk_size

            def prepare(handle: Handle | None) -> Generator[None, None, tuple[Handle | None, SpliceReport | None]]:
                assert handle is not None
                return (yield from splice_for_turn(core, handle, request, chunk))

        prefilled, report, timings = await self._prefill(list(prompt), scope, session, owner, prepare, progress)
        if report is not None and report.deferred:
            report = settle_forget(report, prefilled.reused)
        return Turn(prefilled.handle, list(prompt), report, prefilled.reused, prefilled.approximate,
                    prefilled.last_logits, owner=owner, timings=timings)  # fmt: skip

    async def _prefill(
        self,
        tokens: list[int],
        scope: CacheScope,
        previous: Handle | None,
        owner: str | None,
        prepare: Any,
        progress: PrefillProgress | None = None,
    ) -> tuple[Prefilled, SpliceReport | None, dict[str, float]]:
        """Queue a prefill on the scheduler and wait for it; a requester that goes (this call
        cancelled) gives it up: the scheduler drops it before its next chunk, and a session's old
        base is handed back on the cancellation (:func:`~leyline_server.contract.values.set_kept`).

        A turn with a splice (``prepare``) is given up only until its splice has finished: after it,
        the session is neither its old base nor the prompt, a base its client cannot recognise, so
        the prefill completes and the session is left at the prompt, as a client that
        resynchronises expects (splice turns prefill little: that is their point).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        request = PrefillRequest(tokens, scope, previous, owner, loop, future, self.release, prepare)
        request.progress = progress
        returned = request.returned = loop.create_future() if previous is not None else None
        request.finish_once_spliced = prepare is not None
        self.scheduler.prefill(request)
        try:
            prefilled, report = await (asyncio.shield(future) if prepare is not None else future)
            return prefilled, report, request.timings()
        except asyncio.CancelledError as exc:
            request.cancelled = True  # aborted before its next chunk, or its result released
            self.scheduler.poke()
            if returned is not None:  # the session's base goes back to it
                with anyio.CancelScope(shield=True):
                    back = await _returned(returned)  # (settled when the request is dropped or finished)
                    set_kept(exc, _finished(future) or back)
                    if not future.done():
                        future.cancel()  # (gone for good: a late result is released, scheduling._resolve)
            raise
        except BaseException:
            if returned is not None and returned.done() and returned.result() is not None:
                self.release(returned.result())  # (handed back before the error: see PrefillRequest.fail)
            raise

    def stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        """Decode after ``turn`` in the scheduler's batched steps; ``turn.handle`` ends as prompt + delivered.

        A step counts as delivered once this iterator yielded it (``turn.generated``); steps
        decoded ahead and never taken are not committed.
        """
        return self._stream(turn, params)

    async def _stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        loop = asyncio.get_running_loop()
        stream = Stream(turn.handle, turn.last_logits, params, self.processors(params), turn.owner, loop)
        self.scheduler.open_stream(stream)
        try:
            while True:
                item = await stream.queue.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                stream.taken += 1
                self.scheduler.poke()
                turn.generated.append(item.token)
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled stream still commits before it ends
                try:
                    await self.scheduler.close_stream(stream, len(turn.generated))
                except RuntimeError:  # the engine shut down: nothing to commit into
                    pass

    async def splice(self, handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
        """Apply directives without generating (one atomic job)."""
        return await self.scheduler.call(splice, self.core, handle, request)

    def release(self, handle: Handle) -> None:
        """Unpin ``handle`` on the engine thread (never blocks)."""
        self.scheduler.submit(self.core.release, handle)

    async def close(self) -> None:
        """Stop the engine thread (queued releases run first, work in flight fails), then let the
        core free its memory."""
        await asyncio.to_thread(self.scheduler.shutdown)
        self._compiles.shutdown(wait=False, cancel_futures=True)  # a compile in flight ends on its own
        self.core.close()


async def _returned(returned: asyncio.Future[Handle | None]) -> Handle | None:
    """The old base a dropped prefill hands back; ``None`` if it was consumed or the engine is gone
    (the engine thread settles it at its next round: a minute is far past any chunk)."""
    try:
        return await asyncio.wait_for(returned, RETURN_WAIT_S)
    except TimeoutError:  # (wait_for cancelled it: a late hand-back releases the handle)
        return None


def _finished(future: asyncio.Future[Any]) -> Handle | None:
    """The prompt's handle, if the prefill finished after all (a splice turn finishes once spliced)."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()[0].handle
    return None
