"""The engine thread's run-ahead streaming (``Worker.run_ahead``) on plain Python generators.

A step generator records, on the worker thread, every resume and its own close; the tests check
what the consumer receives against that record: order, how far the producer ran ahead, that a
``last`` step is never resumed, that other jobs get the thread between steps, that a close
happens on the worker after the consumer stopped, and that a failing step surfaces in order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing

import pytest

from leyline_server.engines.threaded import Worker


class Recorder:
    """A generator factory whose steps are ints and whose events are logged with the thread's name."""

    def __init__(self, n: int, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.n, self.delay, self.fail_at = n, delay, fail_at
        self.events: list[tuple[str, int, str]] = []
        self.produced = 0

    def steps(self):
        try:
            for i in range(self.n):
                if self.delay:
                    time.sleep(self.delay)
                if i == self.fail_at:
                    raise RuntimeError(f"step {i} failed")
                self.produced += 1
                self.events.append(("step", i, threading.current_thread().name))
                yield i
        finally:
            self.events.append(("closed", self.produced, threading.current_thread().name))


async def test_every_step_arrives_in_order_and_a_last_step_is_never_resumed():
    worker = Worker("w-test")
    rec = Recorder(10)
    got = [s async for s in worker.run_ahead(rec.steps(), last=lambda s: s == 4)]
    assert got == [0, 1, 2, 3, 4]
    assert [e for e in rec.events if e[0] == "step"][-1][1] == 4  # step 5 was never computed
    assert rec.events[-1][:2] == ("closed", 5) and rec.events[-1][2].startswith("w-test")
    worker.shutdown()


async def test_the_producer_runs_ahead_of_a_slow_consumer_but_at_most_ahead_steps():
    worker = Worker()
    rec = Recorder(200)
    received = 0
    leads = []
    async with aclosing(worker.run_ahead(rec.steps(), last=lambda s: False, ahead=5)) as steps:
        async for _ in steps:
            received += 1
            await asyncio.sleep(0.01)  # the consumer is slow; the worker is not
            leads.append(rec.produced - received)
            if received == 20:
                break
    # while the consumer held the first step of a run, the run's other ahead - 1 steps were
    # computed (it ran ahead), and never more than that
    assert max(leads) == 4
    assert rec.events[-1][0] == "closed" and rec.produced == 20
    worker.shutdown()


async def test_other_jobs_get_the_thread_between_steps():
    worker = Worker()
    rec = Recorder(40, delay=0.005)
    async with aclosing(worker.run_ahead(rec.steps(), last=lambda s: False)) as steps:
        async for i in steps:
            if i == 2:
                await worker.call(lambda: rec.events.append(("job", -1, "")))
                break
    kinds = [e[0] for e in rec.events]
    # the job ran within a step or two of being queued, not after the remaining 37 steps
    assert kinds.index("job") <= 6
    assert kinds[-1] == "closed"
    worker.shutdown()


async def test_a_run_queues_itself_behind_waiting_jobs_and_goes_on():
    worker = Worker()
    rec = Recorder(100, delay=0.002)  # 50 steps take ~100 ms, far longer than the 5 jobs below
    async with aclosing(worker.run_ahead(rec.steps(), last=lambda s: False, ahead=50)) as steps:
        assert await anext(steps) == 0
        marks = []
        for _ in range(5):  # the consumer takes nothing more; other jobs come and go
            marks.append(await worker.call(lambda: rec.produced))
        assert marks == sorted(marks) and marks[-1] > marks[0]  # the run went on between them
        assert rec.produced <= 50
    worker.shutdown()


async def test_two_streams_interleave():
    worker = Worker()
    a, b = Recorder(8, delay=0.003), Recorder(8, delay=0.003)
    order: list[str] = []

    async def consume(tag, rec):
        async for _ in worker.run_ahead(rec.steps(), last=lambda s: False):
            order.append(tag)

    await asyncio.gather(consume("a", a), consume("b", b))
    assert order.count("a") == order.count("b") == 8
    switches = sum(1 for x, y in zip(order, order[1:], strict=False) if x != y)
    assert switches >= 4  # step by step, not one stream then the other
    worker.shutdown()


async def test_a_failing_step_is_raised_after_the_steps_before_it():
    worker = Worker()
    rec = Recorder(10, fail_at=3)
    got = []
    with pytest.raises(RuntimeError, match="step 3 failed"):
        async for s in worker.run_ahead(rec.steps(), last=lambda s: False):
            got.append(s)
    assert got == [0, 1, 2]
    assert rec.events[-1][:2] == ("closed", 3)
    worker.shutdown()


async def test_cancelling_the_consumer_closes_the_generator_on_the_worker():
    worker = Worker("w-cancel")
    rec = Recorder(1000, delay=0.002)
    started = asyncio.Event()

    async def consume():
        async for _ in worker.run_ahead(rec.steps(), last=lambda s: False):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await worker.call(lambda: None)  # the close job ran before this one
    assert rec.events[-1][0] == "closed" and rec.events[-1][2].startswith("w-cancel")
    assert rec.produced < 1000
    worker.shutdown()
