"""Sessions as llama.cpp sequences: shared exact prefixes, private rotated KV, eviction and capacity.

These are the pool's own mechanics, so the engines here never park idle sequences
(``park_budget=0``); ``test_parking.py`` covers parking.
"""

from __future__ import annotations

import pytest

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope, CapacityError
from leyline_server.splice import FallbackCode
from tests.llamacpp.helpers import BASE, fresh_logits, max_diff, prefill, run_splice
from tests.llamacpp.helpers import engine as _engine

A, B = CacheScope(private="a"), CacheScope(private="b")
QUERY = [5, 6, 7]


def engine(path, **kw):
    """An engine that keeps every sequence in the pool (no parking)."""
    return _engine(path, park_budget=0, **kw)


def test_sessions_share_an_exact_prefix_without_recomputing_it(tiny2):
    eng = engine(tiny2)
    a = prefill(eng, BASE, scope=A)[0]
    b, logits, reused = prefill(eng, BASE[:400] + [9, 9, 9], scope=B)
    assert reused == 400  # another session's exact prefix, shared cells
    assert a.entry in b.entry.links and b.entry.links[a.entry] == 400
    assert max_diff(logits, fresh_logits(tiny2, BASE[:400] + [9, 9, 9])) < 1e-4
    other_salt = prefill(eng, BASE + [1], scope=CacheScope(salt="k2", private="c"))[2]
    assert other_salt == 0  # exact KV is shared per salt only


def test_splicing_inside_a_shared_prefix_leaves_the_other_session_intact(tiny1, tiny2):
    for path, exact in ((tiny1, True), (tiny2, False)):
        eng = engine(path)
        a = prefill(eng, BASE, scope=A)[0]
        b_tokens = BASE[:400] + [9, 9, 9]
        b = prefill(eng, b_tokens, scope=B)[0]  # b shares a's cells [0, 400)
        directives = [Directive(start=100, end=150, replacement=[3, 4])]
        a, report = run_splice(eng, a, directives)
        assert report.applied  # a's cells [100, 400) were copied before they moved
        new = apply(BASE, directives)
        eng.check(a)
        eng.check(b)
        assert a.entry.links.get(b.entry, 0) <= 100
        b_logits = prefill(eng, b_tokens + QUERY, previous=b, scope=B)[1]
        assert max_diff(b_logits, fresh_logits(path, b_tokens + QUERY)) < 1e-4  # b is untouched
        a_logits = prefill(eng, new + QUERY, previous=a, scope=A)[1]
        if exact:
            assert max_diff(a_logits, fresh_logits(path, new + QUERY)) < 1e-3


def test_an_unpinned_sharer_is_trimmed_not_moved(tiny1):
    eng = engine(tiny1)
    a = prefill(eng, BASE, scope=A)[0]
    b = prefill(eng, BASE[:300] + [9], scope=B)[0]
    eng.release(b)  # ordinary cache now
    entry = next(e for e in eng.cache.entries.values() if e is not a.entry)
    a, report = run_splice(eng, a, [Directive(start=100, end=150, replacement=[3])])
    assert report.applied and entry.cached == 100  # trimmed to the part that does not move
    assert eng.ctx.pos_max(entry.seq) == 99
    hit = prefill(eng, BASE[:300] + [8], scope=B)[2]
    assert hit == 100


def test_rotated_kv_is_served_only_to_the_session_that_asked(tiny2):
    eng = engine(tiny2)
    a = prefill(eng, BASE, scope=A)[0]
    directives = [Directive(start=50, end=90, replacement=[3, 4])]
    a, _ = run_splice(eng, a, directives)
    new = apply(BASE, directives)
    assert a.exact == 52  # keep + replacement; everything after is approximate
    mine = eng.prefill(new + QUERY, A, previous=a)
    assert mine.reused == len(new) and mine.approximate == len(new) - 52 and mine.handle.exact == 52
    other, other_logits, other_reused = prefill(eng, new + QUERY, scope=B)
    assert other_reused == 52  # another session reuses the exact prefix only
    assert max_diff(other_logits, fresh_logits(tiny2, new + QUERY)) < 1e-4  # and gets a fresh prefill's result
    assert max_diff(mine.last_logits, other_logits) > 1e-2  # (which differs from the spliced one)
    plain, plain_logits, plain_reused = prefill(eng, new + QUERY + [8], scope=CacheScope())
    assert plain_reused == len(new) + len(QUERY)  # b's KV is exact: every request may reuse it
    assert max_diff(plain_logits, fresh_logits(tiny2, new + QUERY + [8])) < 1e-4


def test_the_previous_sequence_is_taken_over(tiny1):
    eng = engine(tiny1)
    a = prefill(eng, BASE, scope=A)[0]
    seq = a.entry.seq
    for extra in ([1, 2], [3], [4, 5, 6]):
        a = prefill(eng, a.tokens + extra, previous=a, scope=A)[0]
        assert a.entry.seq == seq
    assert len(eng.cache.entries) == 1
    eng.check(a)
    a, report = run_splice(eng, a, [Directive(start=10, end=20, replacement=[3], mode="forget")])
    assert report.applied and a.entry.seq == seq and len(eng.cache.entries) == 1  # the old branch is reused
    eng.check(a)


def test_sequences_run_out_then_idle_ones_are_evicted(tiny1):
    eng = engine(tiny1, n_seq_max=9)  # 6 reserved + 3 entries
    handles = [prefill(eng, [10 + i] + BASE[:50], scope=CacheScope(private=f"s{i}"))[0] for i in range(3)]
    with pytest.raises(CapacityError):
        prefill(eng, [99] + BASE[:50], scope=B)
    eng.release(handles[0])
    fourth = prefill(eng, [99] + BASE[:50], scope=B)[0]  # the idle one made room
    assert handles[0].entry is None and fourth.entry.seq not in (h.entry.seq for h in handles[1:])
    assert len(eng.cache.entries) == 3
    for handle in (*handles[1:], fourth):
        eng.release(handle)
    assert eng.drop_idle() == 3 and not eng.cache.entries


def test_cells_run_out_then_idle_ones_are_evicted(tiny1):
    eng = engine(tiny1, n_ctx=256)
    assert eng.info.kv_capacity_tokens == 256
    first = prefill(eng, [11] + BASE[:150], scope=A)[0]
    with pytest.raises(CapacityError):
        prefill(eng, [12] + BASE[:150], scope=B)
    assert len(eng.cache.entries) == 1  # the failed prefill left nothing behind
    eng.check(first)
    eng.release(first)
    second = prefill(eng, [12] + BASE[:150], scope=B)[0]
    assert second.cached == 151 and len(eng.cache.entries) == 1


def test_capacity_fallback_when_unsharing_does_not_fit(tiny1):
    eng = engine(tiny1, n_ctx=256)
    b = prefill(eng, BASE[:100], scope=B)[0]
    a = prefill(eng, BASE[:100] + list(range(300, 400)), scope=A)[0]  # shares [0, 100) with b: 200 cells
    directives = [Directive(start=5, end=150)]  # moving [150, 200) means copying a's shared cells first
    a2, report = run_splice(eng, a, directives)
    assert report.fallback is not None and report.fallback.code == FallbackCode.CAPACITY
    new = apply(a.tokens, directives)
    assert a2.tokens == new and a2.cached == len(new)  # served as a forget, which fits
    eng.check(a2)
    eng.check(b)
    assert max_diff(prefill(eng, new + QUERY, previous=a2, scope=A)[1], fresh_logits(tiny1, new + QUERY)) < 1e-4
