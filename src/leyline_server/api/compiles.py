"""Constraint compiles, fair between keys and answered within a time budget.

Compiling a grammar runs on the engine's compile threads (never on the event loop, never under a
lock the loop waits on) and cannot be interrupted once started. :class:`CompileGate` therefore

* lets each key have **one** compile in flight: a key's next compile waits for its previous one
  (which may still run past its own budget), so one key occupies at most one compile thread and
  another key's compile starts at once while fewer keys than the engine has compile threads are
  compiling;
* answers every request within ``budget_s``: past it, 400 ``constraint_timeout`` naming the
  field, while the compile goes on in the background and its grammar is cached (an identical
  request later is served from the cache);
* never queues a cached grammar behind anything: equal constraints share one compile, and a
  cache hit answers at once (the engine's compile cache, ``engines.grammar``).

A request without a constraint never passes through here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from leyline_server.api.errors import APIError
from leyline_server.engines.values import Constraint

__all__ = ["CompileGate"]


class CompileGate:
    """One compile in flight per key, each answered within ``budget_s`` (see the module docstring)."""

    def __init__(
        self,
        compile: Callable[[Constraint], Awaitable[None]],
        ready: Callable[[Constraint], bool],
        budget_s: float,
    ) -> None:
        if budget_s <= 0:
            raise ValueError("the compile budget must be positive")
        self._compile, self._ready = compile, ready
        self.budget_s = budget_s
        self._running: dict[str | None, asyncio.Future[None]] = {}

    def running(self, key: str | None) -> bool:
        """Whether ``key`` has a compile in flight (maybe past its request's budget)."""
        return key in self._running

    async def check(self, key: str | None, constraint: Constraint, param: str) -> None:
        """Compile ``constraint`` for ``key`` (``ConstraintError`` if impossible; 400 past the budget)."""
        if self._ready(constraint):
            return
        deadline = time.monotonic() + self.budget_s
        previous = self._running.get(key)
        if previous is not None:
            try:
                await asyncio.wait_for(asyncio.shield(previous), self.budget_s)
            except TimeoutError:
                raise self._timeout("this key's previous constraint is still compiling", param) from None
            except Exception:  # noqa: BLE001 - the previous request's failure, reported to it
                pass
        task = asyncio.ensure_future(self._compile(constraint))
        self._running[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        try:
            await asyncio.wait_for(asyncio.shield(task), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise self._timeout(f"the {constraint.kind} did not compile within {self.budget_s:g} s", param) from None

    def _finished(self, key: str | None, done: asyncio.Future[None]) -> None:
        if self._running.get(key) is done:
            del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failure is the waiting request's, never an unhandled one

    def _timeout(self, why: str, param: str) -> APIError:
        return APIError(400, "constraint_timeout", f"{why}; simplify it or retry later", param)
