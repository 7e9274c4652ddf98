"""Constraint compiles, fair between keys and answered within a time budget.

Compiling a grammar runs on the engine's compile threads (never on the event loop, never under a
lock the loop waits on) and cannot be interrupted once started. :class:`CompileGate` therefore

* lets each key have **one** compile in flight: a key's next compile is queued behind its
  previous one (which may still run past its own budget), so one key occupies at most one compile
  thread and another key's compile starts at once while fewer keys than the engine has compile
  threads are compiling;
* separates starting a compile (:meth:`CompileGate.start`, when the turn is prepared) from
  waiting for it (:meth:`CompileGate.wait`, when the turn is about to decode): the grammar
  compiles while the prompt is prefilled, so a stream's opening never waits for it;
* answers every request within ``budget_s`` of its wait: past it, 400 ``constraint_timeout``
  naming the field, while the compile goes on in the background and its grammar is cached (an
  identical request later is served from the cache);
* never queues a cached grammar behind anything: equal constraints share one compile, and a
  cache hit answers at once (the engine's compile cache, ``engines.grammar``).

A request without a constraint never passes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from leyline_server.api.errors import APIError
from leyline_server.contract.values import Constraint, ConstraintError

__all__ = ["CompileGate", "Compiling"]


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

    def start(self, key: str | None, constraint: Constraint) -> asyncio.Future[None] | None:
        """Queue ``key``'s compile of ``constraint`` behind the key's previous one; do not wait for it.

        ``None`` when the grammar is cached. The future is :meth:`wait`'s to bound; left alone, the
        compile still ends and its grammar is cached.
        """
        if self._ready(constraint):
            return None
        task = asyncio.ensure_future(self._after(self._running.get(key), constraint))
        self._running[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    async def wait(self, pending: asyncio.Future[None] | None, constraint: Constraint, param: str) -> None:
        """Wait for a compile :meth:`start` began, at most the budget from now (400 ``constraint_timeout``
        past it; ``ConstraintError`` when it cannot be built)."""
        if pending is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(pending), self.budget_s)
        except TimeoutError:
            raise self._timeout(f"the {constraint.kind} did not compile within {self.budget_s:g} s", param) from None

    async def _after(self, previous: asyncio.Future[None] | None, constraint: Constraint) -> None:
        """The key's previous compile, then this one (unless that one built the same grammar)."""
        if previous is not None:
            try:
                await asyncio.shield(previous)
            except Exception:  # noqa: BLE001 - the previous request's failure, reported to it
                pass
        if not self._ready(constraint):
            await self._compile(constraint)

    def _finished(self, key: str | None, done: asyncio.Future[None]) -> None:
        if self._running.get(key) is done:
            del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failure is the waiting request's, never an unhandled one

    def _timeout(self, why: str, param: str) -> APIError:
        return APIError(400, "constraint_timeout", f"{why}; simplify it or retry later", param)


@dataclass
class Compiling:
    """A turn's constraint, its compile started at the gate (``pending``; ``None``: cached already)."""

    gate: CompileGate
    pending: asyncio.Future[None] | None
    constraint: Constraint
    param: str  # the request field the constraint came from, named when it fails

    async def done(self) -> None:
        """The grammar compiled: 400 ``invalid_constraint`` when it cannot be, ``constraint_timeout``
        when it takes longer than the gate's budget from now."""
        try:
            await self.gate.wait(self.pending, self.constraint, self.param)
        except ConstraintError as exc:
            raise APIError(400, "invalid_constraint", str(exc), self.param) from exc
