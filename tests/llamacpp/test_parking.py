"""Idle sequences parked out of the llama.cpp pool (host memory) and brought back, against oracles.

Parking must be invisible to every request: a parked session's next turn, a request reusing a
parked entry's prefix, a splice of a parked session and a block placed from a parked block give
what they give on an engine that never parks (and, on the one-layer model, what a fresh prefill
gives). The tiny models' weights are a few MB, so any idle sequence is worth parking here.
"""

from __future__ import annotations

import numpy as np
import pytest

from leyline_sdk.core.directives import Directive, KeptRun, apply
from leyline_server.contract.values import CacheScope, SamplingParams
from leyline_server.engines.llamacpp.serving import AsyncLlamaCppEngine
from tests.llamacpp.helpers import BASE, fresh_logits, max_diff, prefill, run_splice
from tests.llamacpp.helpers import engine as _engine

A, B, C = CacheScope(private="a"), CacheScope(private="b"), CacheScope(private="c")
QUERY = [5, 6, 7]
EXACT = 1e-3


def engine(path, **kw):
    """An engine that parks every idle sequence (threshold 0), so the tests do not hang on the cost model."""
    return _engine(path, **{"park_threshold": 0.0, **kw})


def test_an_idle_session_is_parked_by_another_turn_and_comes_back_exact(tiny1):
    eng = engine(tiny1)
    a = prefill(eng, BASE[:300], scope=A)[0]
    b = prefill(eng, [9] + BASE[:200], scope=B)[0]  # b's turn parks a
    assert not a.entry.resident and b.entry.resident and eng.cache.parked_bytes > 0
    assert eng.ctx.pos_max(a.entry.seq) == -1  # a holds no cells in the pool
    eng.check(a)
    a, logits, reused = prefill(eng, a.tokens + QUERY, previous=a, scope=A)
    assert reused == 300 and a.entry.resident and not b.entry.resident  # a came back, b went
    assert max_diff(logits, fresh_logits(tiny1, BASE[:300] + QUERY)) < 1e-4
    eng.check(a)
    eng.check(b)


def test_a_parked_spliced_session_splices_again_like_one_never_parked(tiny2):
    """Two layers: spliced KV is approximate, so the oracle is the same work on an engine that never parks."""
    first = [Directive(start=40, end=120, replacement=[3, 4, 5])]
    results = []
    for budget in (4 << 30, 0):
        eng = engine(tiny2, park_budget=budget)
        a = prefill(eng, BASE, scope=A)[0]
        a, report = run_splice(eng, a, first)
        assert report.applied
        other = prefill(eng, [9] + BASE[:100], scope=B)[0]  # parks a (when parking is on)
        assert a.entry.resident == (budget == 0)
        base = apply(BASE, first)
        second = [Directive(start=200, end=260, replacement=[8, 9])]
        a, report = run_splice(eng, a, second)
        assert report.applied and report.canary == "passed"
        new = apply(base, second)
        results.append(prefill(eng, new + QUERY, previous=a, scope=A)[1])
        eng.check(other)
        eng.close()
    assert max_diff(results[0], results[1]) < 1e-4


def test_a_request_reuses_the_prefix_of_a_parked_entry(tiny1):
    eng = engine(tiny1)
    cached = prefill(eng, BASE, scope=CacheScope())[0]
    entry = cached.entry
    eng.release(cached)  # ordinary cache
    prefill(eng, [1, 2, 3] * 40, scope=B)  # another turn parks it
    assert not entry.resident
    c, logits, reused = prefill(eng, BASE[:400] + [9, 9], scope=C)
    assert reused == 400  # copied from the parked entry, not recomputed
    assert max_diff(logits, fresh_logits(tiny1, BASE[:400] + [9, 9])) < 1e-4
    assert entry in eng.cache.entries.values()  # the parked entry is still there for the next one
    eng.check(c)


def test_a_block_is_placed_from_a_parked_block(tiny1):
    block_tokens = list(range(300, 340))
    eng = engine(tiny1)
    block = eng.prefill(block_tokens, CacheScope(private="block:b1")).handle
    handle = prefill(eng, BASE, scope=A)[0]  # parks the block
    assert not block.entry.resident
    directives = [Directive(start=100, end=150, replacement=block_tokens, block="b1")]
    handle, report = run_splice(eng, handle, directives, blocks={"b1": block})
    assert report.applied and report.fallback is None
    new = apply(BASE, directives)
    logits = prefill(eng, new + QUERY, previous=handle, scope=A)[1]
    assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < EXACT
    eng.check(block)


def test_the_budget_drops_parked_cache_first_and_otherwise_keeps_a_session_in_the_pool(tiny1):
    probe = engine(tiny1)
    one = probe.ctx.state_size(prefill(probe, BASE[:300], scope=A)[0].entry.seq)
    probe.close()
    eng = engine(tiny1, park_budget=int(one * 1.5))
    cache = prefill(eng, [1] + BASE[:299], scope=CacheScope(private="u"))[0]
    cache_entry = cache.entry
    eng.release(cache)
    s1 = prefill(eng, [2] + BASE[:299], scope=A)[0]  # parks the cache entry
    assert not cache_entry.resident
    s2 = prefill(eng, [3] + BASE[:299], scope=B)[0]  # parks s1: the parked cache entry makes room
    assert not s1.entry.resident and cache_entry not in eng.cache.entries.values()
    s3 = prefill(eng, [4] + BASE[:299], scope=C)[0]  # s2 does not fit next to s1: it stays in the pool
    assert s2.entry.resident and s3.entry.resident and not s1.entry.resident
    assert eng.cache.parked_bytes <= eng.cache.park_budget
    for h in (s1, s2, s3):
        eng.check(h)
    s1, logits, _ = prefill(eng, s1.tokens + QUERY, previous=s1, scope=A)
    assert max_diff(logits, fresh_logits(tiny1, [2] + BASE[:299] + QUERY)) < 1e-4


@pytest.mark.parametrize("key_shift", [True, False])
def test_pending_key_shifts_are_applied_before_a_sequence_is_parked(tiny1, key_shift):
    """With seq_add, a splice's moves re-rotate keys lazily; parking serialises keys, so it must
    settle them first. The shifter moves cells through the state API: nothing is left pending."""
    eng = engine(tiny1)
    assert eng.shifter is not None
    if not key_shift:
        eng.shifter = None  # the seq_add path (models whose RoPE the shifter does not handle)
    a = prefill(eng, BASE, scope=A)[0]
    stage = eng.begin(a, 100)  # a deletion of [100, 150) by hand: moves, no fill, no canary decode
    eng.move(stage, a, [KeptRun(150, len(BASE), 100)])
    new = BASE[:100] + BASE[150:]
    a = eng.commit(stage, new, 100, previous=a)
    assert eng.ctx.shift_pending is not key_shift
    prefill(eng, [9] * 50, scope=B)  # parks a
    assert not a.entry.resident
    logits = prefill(eng, new + QUERY, previous=a, scope=A)[1]
    assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < EXACT


async def test_a_stream_in_flight_is_never_parked(tiny1):
    params = SamplingParams(max_tokens=10)
    oracle = engine(tiny1)
    expected = {}
    for name, prompt in (("a", BASE[:200]), ("b", [9] + BASE[:150])):
        result = oracle.prefill(prompt, A)
        expected[name] = [s.token for s in oracle.decode(result.handle, result.last_logits, params)]
        oracle.release(result.handle)
    oracle.close()

    front = AsyncLlamaCppEngine(engine(tiny1))
    turn_a = await front.start_turn(BASE[:200], A, None, None)
    stream_a = front.stream(turn_a, params)
    got_a = [(await anext(stream_a)).token for _ in range(2)]
    turn_b = await front.start_turn([9] + BASE[:150], B, None, None)  # focuses b while a decodes
    assert await front.scheduler.call(lambda: turn_a.handle.entry.resident)
    got_b = [s.token async for s in front.stream(turn_b, params)]
    got_a += [s.token async for s in stream_a]
    assert got_a == expected["a"] and got_b == expected["b"]
    for turn in (turn_a, turn_b):
        await front.scheduler.call(front.core.check, turn.handle)
        front.release(turn.handle)
    await front.close()
    assert np.isfinite(got_a).all()


def test_a_few_idle_cells_are_left_in_the_pool_many_are_parked(tiny1):
    eng = _engine(tiny1)  # the default threshold: park when idle cells would cost > 5 % per decode step
    policy = eng.parking
    small = prefill(eng, [1] * 8, scope=A)[0]
    big = prefill(eng, BASE, scope=B)[0]
    assert policy.slowdown(8, len(BASE)) < policy.threshold and small.entry.resident
    c = prefill(eng, [2] * 20, scope=C)[0]
    assert policy.slowdown(len(BASE) + 8, 20) > policy.threshold and not big.entry.resident
    for h in (small, big, c):
        eng.check(h)


def test_a_sequence_being_spliced_is_never_parked_to_make_room(tiny1):
    eng = engine(tiny1)
    a = prefill(eng, BASE[:200], scope=A)[0]
    stage = eng.begin(a, 50)
    assert a.entry.busy == 1
    assert not eng.cache.make_room()  # the only sequence in the pool is at work: nothing to park
    assert a.entry.resident
    eng.abort(stage)
    assert a.entry.busy == 0 and eng.cache.make_room() and not a.entry.resident  # idle now: it may go
    stage = eng.begin(a, 200)  # (comes back first)
    a = eng.commit(stage, BASE[:200], 200, previous=a)
    assert a.entry.busy == 0
    logits = prefill(eng, BASE[:200] + QUERY, previous=a, scope=A)[1]
    assert max_diff(logits, fresh_logits(tiny1, BASE[:200] + QUERY)) < 1e-4
