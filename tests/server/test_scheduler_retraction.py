"""Retraction on the engine thread: a pool too small for every running stream's growth.

Oracles: each stream decoded alone on a fresh engine (greedy: the same tokens, retracted or not);
``check_integrity`` and a pool that can be taken whole afterwards (nothing leaked, nothing locked);
the scheduler's count of retractions (it did happen).
"""

from __future__ import annotations

import asyncio

from leyline_server.contract.values import CacheScope, CapacityError, SamplingParams
from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine
from leyline_server.engines.retraction import victim
from tests.server.engine_helpers import engine, prefill

LONG = SamplingParams(max_tokens=150, ignore_eos=True)
POOL_MB = 0.125  # tiny-gqa, one layer: 512 tokens; two streams of 60 + 150 fit, three do not


def _prompt(i: int, n: int = 60) -> list[int]:
    return [(31 * i + 7 * k) % 900 + 50 for k in range(n)]


def _alone(prompt: list[int], params: SamplingParams = LONG) -> list[int]:
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=8)
    pinned, logits, _ = prefill(eng, prompt, scope=CacheScope())
    return [s.token for s in eng.decode(pinned, logits, params)]


async def _read(front: AsyncEmbeddedEngine, prompt: list[int], key: str, scope: CacheScope) -> tuple[list[int], list]:
    """A plain turn read to its end, then released (as the server does): (answer, the handle's tokens)."""
    turn = await front.start_turn(prompt, scope, None, None, key)
    tokens = [step.token async for step in front.stream(turn, LONG)]
    kept = list(turn.handle.tokens)
    front.release(turn.handle)
    return tokens, kept


async def _nothing_held(front: AsyncEmbeddedEngine, eng) -> None:
    await front.scheduler.call(lambda: None)
    await front.scheduler.call(eng.check_integrity)
    assert not eng.in_flight
    slots = await front.scheduler.call(eng.alloc, eng.pool.capacity)  # nothing is locked
    await front.scheduler.call(eng.free, slots)


async def test_streams_the_pool_cannot_hold_together_are_retracted_and_answer_as_alone():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=POOL_MB)
    capacity = eng.pool.capacity
    assert 2 * (60 + 150) < capacity < 3 * (60 + 150), capacity
    front = AsyncEmbeddedEngine(eng, chunk_size=64)
    prompts = [_prompt(i) for i in range(3)]
    scopes = [CacheScope(private=f"s{i}") for i in range(3)]  # sessions' scopes: approximate tags too
    reads = [_read(front, p, f"k{i}", s) for i, (p, s) in enumerate(zip(prompts, scopes, strict=True))]
    got = await asyncio.gather(*reads)
    assert [tokens for tokens, _ in got] == [_alone(p) for p in prompts]
    assert front.scheduler.retractions.total >= 1  # the pool did run short
    for (tokens, kept), prompt in zip(got, prompts, strict=True):
        assert kept == prompt + tokens  # each handle ends as prompt + answer, as unretracted
    await _nothing_held(front, eng)
    await front.close()


async def test_a_stream_closed_while_retracted_keeps_what_its_client_took():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=POOL_MB)
    front = AsyncEmbeddedEngine(eng, chunk_size=64)
    turns = [await front.start_turn(_prompt(i), CacheScope(), None, None, "k") for i in range(3)]
    taken: list[list[int]] = [[], [], []]

    async def read(i: int) -> None:
        async for step in front.stream(turns[i], LONG):
            taken[i].append(step.token)

    readers = [asyncio.create_task(read(i)) for i in range(3)]
    while front.scheduler.retractions.total == 0:  # until the pool runs short
        await asyncio.sleep(0.001)
    (retracted,) = front.scheduler.retractions.all()
    i = next(i for i, t in enumerate(turns) if t.handle is retracted.handle)
    readers[i].cancel()  # its client goes while it is retracted
    await asyncio.gather(*readers, return_exceptions=True)
    assert len(taken[i]) < LONG.max_tokens and all(len(taken[j]) == LONG.max_tokens for j in range(3) if j != i)
    for j, t in enumerate(turns):
        assert t.handle.tokens == _prompt(j) + taken[j]  # what each client took, no more
        assert taken[j] == _alone(_prompt(j))[: len(taken[j])]
        front.release(t.handle)
    await _nothing_held(front, eng)
    await front.close()


async def test_the_last_stream_is_not_retracted_without_other_work_and_fails_as_before():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=POOL_MB)
    front = AsyncEmbeddedEngine(eng, chunk_size=64)
    params = SamplingParams(max_tokens=2 * eng.pool.capacity, ignore_eos=True)  # more than the pool holds
    turn = await front.start_turn(_prompt(0), CacheScope(), None, None, "k")
    failed = None
    try:
        async for _ in front.stream(turn, params):
            pass
    except CapacityError as exc:
        failed = exc
    assert failed is not None and front.scheduler.retractions.total == 0
    front.release(turn.handle)
    await _nothing_held(front, eng)
    await front.close()


def test_the_victim_is_a_paused_stream_then_the_one_with_the_fewest_tokens_then_the_longest_context():
    from tests.server.test_scheduler import _stream

    a, b, c = _stream("a"), _stream("b"), _stream("c")
    for s, (generated, context) in zip((a, b, c), ((5, 10), (3, 10), (3, 50)), strict=True):
        s.generated, s.taken = generated, generated
        s.handle = type("H", (), {"tokens": [0] * context})()  # type: ignore[assignment]
    assert victim([a, b, c], ahead=16) is c  # fewest generated (3), then the longest context (50)
    a.taken = a.generated - 16  # a's reader stopped: it sits out, holding its KV
    assert victim([a, b, c], ahead=16) is a


async def test_a_prefill_without_room_retracts_a_stream_its_reader_left_paused():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=POOL_MB)
    front = AsyncEmbeddedEngine(eng, chunk_size=64)
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    paused_prompt, other_prompt = _prompt(1, 300), _prompt(2, 300)  # 2 x 300 > the pool's 512
    turn = await front.start_turn(paused_prompt, CacheScope(), None, None, "a")
    stream = front.stream(turn, params)
    first = (await anext(stream)).token  # then its reader stops: it decodes its run-ahead and sits out
    other = await asyncio.wait_for(front.start_turn(other_prompt, CacheScope(), None, None, "b"), 30)
    assert front.scheduler.retractions.total == 1  # the paused stream gave its room to the prefill
    front.release(other.handle)  # (the server does when that turn ends): room comes back
    rest = [step.token async for step in stream]  # the reader goes on: resumed, the same answer
    assert [first, *rest] == _alone(paused_prompt, params)
    front.release(turn.handle)
    await _nothing_held(front, eng)
    await front.close()
