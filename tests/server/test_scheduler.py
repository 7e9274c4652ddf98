"""The scheduler: its two choices (pure), then the engine thread driving the embedded engine.

Oracles: the one-sequence path (``decode()`` alone on a fresh engine) for what a batch computes;
step counts, not clocks, for fairness and run-ahead; ``check_integrity`` (every slot free, owned or
in flight exactly once) after cancellations and failures.
"""

from __future__ import annotations

import asyncio
from collections import deque

import pytest
import torch

from leyline_server.contract.jobs import PrefillJob
from leyline_server.contract.values import CacheScope, CapacityError, SamplingParams
from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine
from leyline_server.engines.scheduling import PrefillRequest, Stream, pick_chunks, pick_decodes
from tests.server.engine_helpers import engine, prefill

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


# -- the choices ------------------------------------------------------------------------------------
def _request(key: str, left: int) -> PrefillRequest:
    loop = asyncio.new_event_loop()
    request = PrefillRequest([0] * left, CacheScope(), None, key, loop, loop.create_future(), lambda h: None)
    request.job = PrefillJob([0] * left, CacheScope(), None)
    loop.close()
    return request


def test_the_key_served_longest_ago_gets_the_chunk_and_others_join_only_whole():
    a1, a2, b, c = _request("a", 1000), _request("a", 5), _request("b", 30), _request("c", 500)
    queues = {"a": deque([a1, a2]), "b": deque([b]), "c": deque([c])}
    got = pick_chunks(queues, {"a": 3, "b": 1, "c": 2}, budget=256)
    # b first; c (500) and a1 (1000) do not fit whole; a2 (5) does
    assert [(p.request, p.tokens) for p in got] == [(b, 30), (a2, 5)]
    got = pick_chunks(queues, {"a": 1, "b": 3, "c": 2}, budget=256)
    assert [(p.request, p.tokens) for p in got] == [(a1, 256)]  # a1 takes the budget: nothing else fits
    got = pick_chunks(queues, {"a": 1, "b": 3, "c": 2}, budget=600)
    assert [(p.request, p.tokens) for p in got] == [(a1, 600)]
    got = pick_chunks({"a": deque([a2, _request("a", 7)]), "b": deque([b])}, {"a": 1, "b": 3}, budget=256)
    assert [(p.request.key, p.tokens) for p in got] == [("a", 5), ("b", 30), ("a", 7)]  # short ones share
    got = pick_chunks(queues, {"c": 0}, budget=600)  # unserved keys count as served at -1
    assert [(p.request.key, p.tokens) for p in got] == [("a", 600)]


def _stream(key: str) -> Stream:
    loop = asyncio.new_event_loop()
    s = Stream(None, None, GREEDY, None, key, loop)  # type: ignore[arg-type]
    loop.close()

    class Job:
        finished, pending, retracted = False, 1, False

    s.job = Job()  # type: ignore[assignment]
    return s


def test_past_max_running_keys_take_turns_and_streams_within_a_key_too():
    mine = [_stream("a") for _ in range(6)]
    other = _stream("b")
    seen: list[list[Stream]] = []
    for step in range(6):
        seen.append(pick_decodes([*mine, other], ahead=16, max_running=3, step=step))
    assert all(other in chosen for chosen in seen)  # key b's only stream decodes every step
    assert all(len(chosen) == 3 for chosen in seen)
    assert all(sum(s in chosen for chosen in seen) == 2 for s in mine)  # a's six share the other two places


def test_a_stream_past_its_run_ahead_sits_out():
    s = _stream("a")
    s.generated, s.taken = 16, 0
    assert pick_decodes([s], ahead=16, max_running=8, step=0) == []
    s.taken = 1
    assert pick_decodes([s], ahead=16, max_running=8, step=1) == [s]


# -- the engine thread ----------------------------------------------------------------------------
async def _decode(front: AsyncEmbeddedEngine, prompt: list[int], owner: str | None = None) -> list[int]:
    turn = await front.start_turn(prompt, CacheScope(), None, None, owner)
    tokens = [step.token async for step in front.stream(turn, GREEDY)]
    front.release(turn.handle)
    return tokens


def _alone(name: str, prompt: list[int]) -> list[int]:
    eng = engine(name, layers=2)
    pinned, logits, _ = prefill(eng, prompt, scope=CacheScope())
    return [s.token for s in eng.decode(pinned, logits, GREEDY)]


@pytest.mark.parametrize("name", ["tiny-gqa", "tiny-mla"])
async def test_eight_concurrent_streams_decode_in_shared_steps_and_as_alone(name):
    eng = engine(name, layers=2)
    front = AsyncEmbeddedEngine(eng)
    prompts = [[10 + i, 20 + i * 3, 30 + i] * (1 + i) for i in range(8)]
    got = await asyncio.gather(*(_decode(front, p, f"k{i % 3}") for i, p in enumerate(prompts)))
    assert got == [_alone(name, p) for p in prompts]
    assert front.scheduler.steps < 8 * GREEDY.max_tokens  # the streams shared steps
    await front.scheduler.call(eng.check_integrity)
    await front.close()


async def test_a_long_prefill_holds_another_keys_short_one_back_one_chunk():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=8)
    front = AsyncEmbeddedEngine(eng, chunk_size=16)
    long = asyncio.create_task(front.start_turn([100 + i % 500 for i in range(800)], CacheScope(), None, None, "a"))
    while front.scheduler.steps < 3:  # key a's prefill is under way (50 chunks)
        await asyncio.sleep(0.001)
    before = front.scheduler.steps
    short = await front.start_turn([7, 8, 9, 10], CacheScope(), None, None, "b")
    assert front.scheduler.steps - before <= 2  # a's chunk in flight, then b's step
    assert not long.done()
    turn = await long
    for t in (short, turn):
        front.release(t.handle)
    await front.scheduler.call(eng.check_integrity)
    await front.close()


async def test_an_unread_stream_stops_after_its_run_ahead_and_keeps_only_what_was_taken():
    eng = engine("tiny-gqa", layers=1)
    front = AsyncEmbeddedEngine(eng, ahead=4)
    turn = await front.start_turn([5, 6, 7], CacheScope(), None, None)
    before = front.scheduler.steps
    stream = front.stream(turn, SamplingParams(max_tokens=100, ignore_eos=True))
    first = await stream.__anext__()
    await asyncio.sleep(0.3)  # the consumer reads nothing more
    # the first token comes from the prefill's logits; then `ahead` steps past the one taken, no more
    assert front.scheduler.steps - before == 4
    await stream.aclose()
    assert turn.handle.tokens == [5, 6, 7, first.token] and turn.handle.cached == 4  # its KV was computed
    front.release(turn.handle)
    await front.scheduler.call(eng.check_integrity)
    await front.close()


async def test_a_prefill_given_up_midway_is_aborted_and_frees_everything():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=8)
    front = AsyncEmbeddedEngine(eng, chunk_size=16)
    task = asyncio.create_task(front.start_turn([100 + i % 500 for i in range(800)], CacheScope(), None, None))
    while front.scheduler.steps < 3:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _nothing_held(front, eng)
    await front.close()


async def _nothing_held(front: AsyncEmbeddedEngine, eng) -> None:
    """Every slot accounted for, none in flight, none locked: the whole pool can be taken."""
    await front.scheduler.call(lambda: None)  # a round whose step drops what was given up
    await front.scheduler.call(eng.check_integrity)
    assert not eng.in_flight
    slots = await front.scheduler.call(eng.alloc, eng.pool.capacity)  # evicts all cache: nothing is locked
    await front.scheduler.call(eng.free, slots)


async def test_a_prefill_without_room_fails_alone_and_releases_its_session():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=0.05)
    front = AsyncEmbeddedEngine(eng)
    session = await front.open([1, 2, 3], CacheScope(private="s"))
    with pytest.raises(CapacityError):
        await front.start_turn([1, 2, 3] + [50] * eng.pool.capacity, CacheScope(private="s"), session, None)
    await _nothing_held(front, eng)  # the session's handle went with the failed turn
    await front.close()


async def test_another_keys_prompt_joins_the_next_step_beside_many_streams():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=8)
    front = AsyncEmbeddedEngine(eng)
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    turns = [await front.start_turn([3 + i, 4, 5], CacheScope(), None, None, "a") for i in range(32)]
    streams = [front.stream(t, params) for t in turns]
    for s in streams:  # key A's 32 streams are decoding, read as fast as they come
        await anext(s)
    readers = [asyncio.create_task(_drain(s)) for s in streams]
    before = front.scheduler.steps
    short = await front.start_turn([7, 8, 9, 10], CacheScope(), None, None, "b")
    served = front.scheduler.served_at("b")
    assert served is not None and served - before <= 2  # the step in flight, then the one with B's prompt
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for t in [*turns, short]:
        front.release(t.handle)
    await _nothing_held(front, eng)
    await front.close()


async def _drain(stream) -> None:
    async for _ in stream:
        pass


async def test_a_long_replacement_is_spliced_in_chunks_between_other_streams_steps():
    from leyline_sdk.core.directives import Directive
    from leyline_server.contract.values import SpliceRequest

    base = [10 + i % 300 for i in range(120)]
    replacement = [400 + i % 200 for i in range(100)]
    prompt = base[:20] + replacement + base[40:] + [5]
    request = SpliceRequest([Directive(start=20, end=40, replacement=replacement)], prompt=prompt)
    oracle_eng = engine("tiny-gqa", layers=2)
    oracle = AsyncEmbeddedEngine(oracle_eng)  # the whole replacement in one job
    first = await oracle.start_turn(base, CacheScope(private="s"), None, None)
    whole = await oracle.start_turn(prompt, CacheScope(private="s"), first.handle, request)
    await oracle.close()

    eng = engine("tiny-gqa", layers=2)
    front = AsyncEmbeddedEngine(eng, chunk_size=16)
    session = await front.start_turn(base, CacheScope(private="s"), None, None)
    other = await front.start_turn([3, 4, 5], CacheScope(), None, None, "k")
    stream = front.stream(other, SamplingParams(max_tokens=400, ignore_eos=True))
    await anext(stream)
    reader = asyncio.create_task(_drain(stream))
    before = front.scheduler.steps
    spliced = await front.start_turn(prompt, CacheScope(private="s"), session.handle, request)
    assert front.scheduler.steps - before >= 100 // 16  # the other stream stepped between the chunks
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    assert spliced.report is not None and spliced.report.applied and spliced.report.prefilled_tokens == 100
    torch.testing.assert_close(spliced.last_logits, whole.last_logits, rtol=1e-4, atol=1e-4)
    front.release(spliced.handle)
    front.release(other.handle)
    await _nothing_held(front, eng)
    await front.close()


async def test_a_turn_given_up_during_its_splice_aborts_it_and_frees_everything():
    from leyline_sdk.core.directives import Directive
    from leyline_server.contract.values import SpliceRequest

    base = [10 + i % 300 for i in range(120)]
    replacement = [400 + i % 200 for i in range(3000)]
    prompt = base[:20] + replacement + base[40:]
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=8)
    front = AsyncEmbeddedEngine(eng, chunk_size=16)
    session = await front.start_turn(base, CacheScope(private="s"), None, None)
    request = SpliceRequest([Directive(start=20, end=40, replacement=replacement)], prompt=prompt)
    task = asyncio.create_task(front.start_turn(prompt, CacheScope(private="s"), session.handle, request))
    while not any(r.splicing for q in front.scheduler._prefills.values() for r in q):
        await asyncio.sleep(0)  # until the splice is under way (the replacement's chunks, 188 of them)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _nothing_held(front, eng)  # the stage's slots freed, the session's handle released
    await front.close()


async def test_a_stream_given_up_before_the_engine_started_it_is_never_decoded():
    import threading

    eng = engine("tiny-gqa", layers=1)
    front = AsyncEmbeddedEngine(eng)
    turn = await front.start_turn([5, 6, 7], CacheScope(), None, None)
    gate = threading.Event()
    busy = asyncio.ensure_future(front.scheduler.call(gate.wait))  # the engine thread is held up
    await asyncio.sleep(0.05)
    stream = front.stream(turn, SamplingParams(max_tokens=50, ignore_eos=True))
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # queued, not started
    first.cancel()  # its client went: the close is queued before the stream's start
    await asyncio.sleep(0.05)
    gate.set()
    await busy
    await asyncio.gather(first, return_exceptions=True)
    await front.scheduler.call(lambda: None)
    assert not front.scheduler._streams  # (it was started after its close, and decoded for good)
    assert turn.handle.tokens == [5, 6, 7]
    front.release(turn.handle)
    await _nothing_held(front, eng)
    await front.close()
