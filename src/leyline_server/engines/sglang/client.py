"""SGLang's tokenizer manager on its own event loop thread, usable from any thread or event loop.

The tokenizer manager (main process) owns the ZMQ sockets to the schedulers and must be driven
from one event loop. Leyline's service runs on uvicorn's loop and its splices on worker threads,
so the manager gets a private loop in a daemon thread; everything is submitted there:

* ``control`` / ``post`` — a :class:`~.plugin.LeylineCtlReq` to every scheduler rank; replies are
  matched by ``rid`` (so concurrent control requests need no queue);
* ``prefill`` — one request of ``max_new_tokens=1`` (the prompt is cached when it finishes);
* ``stream`` — a generation whose chunks are handed to the caller's loop through a queue.

The manager's handle loop is attached here without SGLang's SIGTERM/SIGQUIT handlers: shutdown
belongs to Leyline's server (it drains its requests, then :meth:`close` stops SGLang).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from leyline_server.engines.sglang.backend import ControlError
from leyline_server.engines.sglang.plugin import LeylineCtlOut, LeylineCtlReq

__all__ = ["SGLangClient", "FILL_MAX_NEW_TOKENS"]

T = TypeVar("T")
# A fill is a normal request of one new token: SGLang inserts exactly the prompt into its tree
# when it finishes (``owned_kv_len = min(committed, prompt + 1) = prompt``). ``0`` (prefill-only)
# does the same through SGLang's prefill-only batches.
FILL_MAX_NEW_TOKENS = 1
_DONE = object()


class SGLangClient:
    """Drive ``tokenizer_manager`` from any thread (see the module docstring)."""

    def __init__(self, tokenizer_manager: Any) -> None:
        self.tm = tokenizer_manager
        self.loop = asyncio.new_event_loop()
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._thread = threading.Thread(target=self._run, name="leyline-sglang-loop", daemon=True)
        self._thread.start()
        self.submit(self._attach()).result()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _attach(self) -> None:
        from sglang.srt.managers.tokenizer_manager import print_exception_wrapper
        from sglang.utils import TypeBasedDispatcher

        tm = self.tm
        if tm.event_loop is None:  # what auto_create_handle_loop does, minus the signal handlers
            tm.event_loop = self.loop
            tm.asyncio_tasks.add(self.loop.create_task(print_exception_wrapper(tm.handle_loop)))
        tm._result_dispatcher += TypeBasedDispatcher([(LeylineCtlOut, self._on_reply)])

    def _on_reply(self, out: LeylineCtlOut) -> None:
        future = self._waiting.pop(out.rid, None)
        if future is not None and not future.done():
            future.set_result(out)

    # -- running things on the manager's loop ---------------------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the manager's loop (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` (run on the manager's loop) from another event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    # -- control requests -------------------------------------------------------------------------------
    async def _control(self, op: str, args: dict[str, Any], wait: bool) -> dict[str, Any]:
        rid = f"leyline-{uuid.uuid4().hex}"
        future: asyncio.Future[Any] | None = None
        if wait:
            future = self.loop.create_future()
            self._waiting[rid] = future
        self.tm._dispatch_to_scheduler(LeylineCtlReq(rid=rid, op=op, body=json.dumps(args)))
        if future is None:
            return {}
        reply = json.loads((await future).body)
        if not reply.get("ok"):
            raise ControlError(str(reply.get("code", "error")), str(reply.get("message", "")))
        return dict(reply)

    def control(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One control request, waited for (not from the manager's own loop)."""
        return self.submit(self._control(op, args, True)).result()

    def post(self, op: str, args: dict[str, Any]) -> None:
        """One control request, not waited for (its reply is dropped)."""
        self.submit(self._control(op, args, False))

    # -- requests ---------------------------------------------------------------------------------------
    async def _prefill(self, tokens: list[int], ns: str | None) -> int:
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(
            input_ids=tokens, sampling_params={"max_new_tokens": FILL_MAX_NEW_TOKENS}, cache_salt=ns, stream=False
        )
        out = await self.tm.generate_request(obj, None).__anext__()
        meta = out.get("meta_info", {})
        reason = meta.get("finish_reason") or {}
        if isinstance(reason, dict) and reason.get("type") == "abort":
            raise RuntimeError(f"SGLang aborted a prefill: {reason.get('message', reason)}")
        return int(meta.get("cached_tokens", 0))

    def prefill(self, tokens: list[int], ns: str | None) -> int:
        """Cache ``tokens`` in namespace ``ns``; how many were reused (blocking, from a worker thread)."""
        return self.submit(self._prefill(tokens, ns)).result()

    @staticmethod
    def _snapshot(chunk: dict[str, Any]) -> dict[str, Any]:
        """A copy of a chunk's growing lists (SGLang hands out references it keeps extending)."""
        meta = dict(chunk.get("meta_info") or {})
        for key in ("output_token_logprobs", "output_top_logprobs"):
            if isinstance(meta.get(key), list):
                meta[key] = list(meta[key])
        return {**chunk, "output_ids": list(chunk.get("output_ids") or []), "meta_info": meta}

    async def _pump(self, obj: Any, push: Any) -> None:
        try:
            async for chunk in self.tm.generate_request(obj, None):
                push(self._snapshot(chunk))
        except BaseException as exc:  # delivered to the consumer, which re-raises it
            push(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            push(_DONE)

    async def generate(
        self, tokens: list[int], ns: str | None, sampling: dict[str, Any], extra: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream a generation after ``tokens`` in namespace ``ns``: SGLang's chunks, on the caller's loop.

        Closing the iterator early aborts the request in SGLang.
        """
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(
            input_ids=list(tokens),
            sampling_params=sampling,
            cache_salt=ns,
            stream=True,
            rid=f"leyline-gen-{uuid.uuid4().hex}",
            **extra,
        )
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = self.submit(self._pump(obj, lambda item: caller.call_soon_threadsafe(queue.put_nowait, item)))
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not finished:
                self.loop.call_soon_threadsafe(self.tm.abort_request, obj.rid)
                task.cancel()

    def close(self) -> None:
        """Stop the manager's loop thread (SGLang's processes are shut down by the engine)."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
