"""Splices on llama.cpp against the exact oracle: on a one-layer model (float32 cache, flash attention
off) an amortize splice equals a fresh prefill of the edited sequence, since layer-0 KV depends only
on token and position; with two layers the downstream KV keeps its notes (and differs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope, SamplingParams
from leyline_server.splice import FallbackCode, SpliceError
from tests.llamacpp.helpers import BASE, engine, fresh_logits, max_diff, prefill, run_splice

EDITS = {
    "one": [Directive(start=20, end=245, replacement=[3, 4, 5, 6])],
    "two": [Directive(start=5, end=9, replacement=[]), Directive(start=30, end=50, replacement=[8, 9])],
    "three": [
        Directive(start=2, end=2, replacement=[10, 11, 12]),
        Directive(start=20, end=40, replacement=[13]),
        Directive(start=60, end=61, replacement=[14, 15, 16, 17]),
    ],
    "grow": [Directive(start=100, end=102, replacement=list(range(200, 260)))],
    "delete-only": [Directive(start=100, end=300)],
    "at-zero": [Directive(start=0, end=10, replacement=[21, 22])],
}
QUERY = [5, 6, 7]
SCOPE_BLOCK = CacheScope(private="block:b1")
EXACT = 1e-3  # the float32 cache rotates keys twice: ~1e-4 on logits of magnitude ~5


@pytest.mark.parametrize("edit", list(EDITS))
def test_one_layer_splice_equals_fresh_prefill(edit, tiny1):
    directives = EDITS[edit]
    new = apply(BASE, directives)
    eng = engine(tiny1)
    handle = prefill(eng, BASE)[0]
    handle, report = run_splice(eng, handle, directives)
    assert report.applied and report.fallback is None and report.canary == "passed"
    assert report.rotated_tokens > 0 and report.prefilled_tokens == sum(len(d.replacement) for d in directives)
    assert handle.tokens == new and handle.cached == len(new)
    eng.check(handle)
    after, logits, reused = prefill(eng, new + QUERY, previous=handle)
    assert reused == len(new)  # the continuation reuses the whole spliced sequence
    ref = fresh_logits(tiny1, new + QUERY)
    unedited = fresh_logits(tiny1, BASE + QUERY)
    assert max_diff(logits, ref) < EXACT
    assert max_diff(unedited, ref) > 20 * EXACT  # the oracle can tell an edit from none
    eng.close()


def test_splice_then_decode_equals_fresh_decode(tiny1):
    directives = EDITS["three"]
    new = apply(BASE, directives)
    eng, ref = engine(tiny1), engine(tiny1)
    handle, _ = run_splice(eng, prefill(eng, BASE)[0], directives)
    handle, logits, _ = prefill(eng, new + QUERY, previous=handle)
    ref_handle, ref_logits, _ = prefill(ref, new + QUERY)
    params = SamplingParams(max_tokens=12)
    assert [s.token for s in eng.decode(handle, logits, params)] == [
        s.token for s in ref.decode(ref_handle, ref_logits, params)
    ]
    assert handle.tokens == new + QUERY + handle.tokens[len(new) + len(QUERY) :] and handle.cached == len(new) + 14
    eng.check(handle)


def test_two_layers_keep_their_notes(tiny2):
    directives = EDITS["one"]
    new = apply(BASE, directives)
    eng = engine(tiny2)
    handle, _ = run_splice(eng, prefill(eng, BASE)[0], directives)
    amortized = prefill(eng, new + QUERY, previous=handle)[1]
    ref = fresh_logits(tiny2, new + QUERY)
    assert max_diff(amortized, ref) > 1e-2  # layer 1 still attends to what was removed: nothing recomputed


def test_successive_splices_stay_exact(tiny1):
    eng = engine(tiny1)
    handle = prefill(eng, BASE)[0]
    tokens = list(BASE)
    rng = np.random.default_rng(0)
    for _ in range(8):
        a = int(rng.integers(0, len(tokens) - 20))
        d = Directive(start=a, end=a + int(rng.integers(0, 20)), replacement=rng.integers(7, 1000, 5).tolist())
        handle, report = run_splice(eng, handle, [d])
        tokens = apply(tokens, [d])
        assert report.applied and handle.tokens == tokens
        eng.check(handle)
    assert max(eng.rotation_counts(handle, range(len(tokens)))) >= 2
    logits = prefill(eng, tokens + QUERY, previous=handle)[1]
    assert max_diff(logits, fresh_logits(tiny1, tokens + QUERY)) < EXACT


def test_forget_and_mixed_modes(tiny1):
    directives = [
        Directive(start=10, end=20, replacement=[1, 2]),
        Directive(start=50, end=55, replacement=[3], mode="forget"),
    ]
    new = apply(BASE, directives)
    eng = engine(tiny1)
    handle, report = run_splice(eng, prefill(eng, BASE)[0], directives)
    assert report.applied and report.rotated_tokens == 30 and report.reused_tokens == 10
    assert report.prefilled_tokens == 2 + len(new) - (50 - 8)
    logits = prefill(eng, new + QUERY, previous=handle)[1]
    assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < EXACT
    forget = [Directive(start=20, end=45, replacement=[3, 4], mode="forget")]
    handle, report = run_splice(eng, prefill(eng, BASE)[0], forget)
    assert report.applied and report.rotated_tokens == 0 and report.reused_tokens == 20


def test_a_block_is_placed_by_rotation(tiny1):
    block_tokens = list(range(300, 340))
    eng = engine(tiny1)
    block = eng.prefill(block_tokens, SCOPE_BLOCK).handle
    handle = prefill(eng, BASE)[0]
    directives = [Directive(start=100, end=150, replacement=block_tokens, block="b1")]
    handle, report = run_splice(eng, handle, directives, blocks={"b1": block})
    new = apply(BASE, directives)
    assert report.applied and report.rotated_tokens == (len(BASE) - 150) + len(block_tokens)
    eng.check(handle)
    assert block.cached == len(block_tokens)  # the block itself is untouched
    eng.check(block)
    logits = prefill(eng, new + QUERY, previous=handle)[1]
    assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < EXACT  # one layer: placed rows are exact
    again = prefill(eng, block_tokens + QUERY, scope=SCOPE_BLOCK)[1]
    assert max_diff(again, fresh_logits(tiny1, block_tokens + QUERY)) < EXACT


# -- fallbacks: each engine-dependent code provoked for real -------------------------------------
def test_drift_budget_and_canary_fallbacks_give_the_fresh_result(tiny1):
    directives = EDITS["one"]
    new = apply(BASE, directives)
    for code, tweak in [
        (FallbackCode.DRIFT_BUDGET, lambda e: setattr(e, "rotation_budget", 0)),
        (FallbackCode.CANARY_FAILED, lambda e: setattr(e, "canary_tolerance", 0.0)),  # rotation rounds: error > 0
        (FallbackCode.ROPE_UNSUPPORTED, lambda e: setattr(e, "_info", dataclasses.replace(e.info, shiftable=False))),
    ]:
        eng = engine(tiny1)
        tweak(eng)
        handle, report = run_splice(eng, prefill(eng, BASE)[0], directives)
        assert report.fallback is not None and report.fallback.code == code, report
        assert not report.applied and report.rotated_tokens == 0 and handle.tokens == new
        eng.check(handle)
        logits = prefill(eng, new + QUERY, previous=handle)[1]
        assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < 1e-4  # a forget is a fresh prefill
        eng = engine(tiny1)
        tweak(eng)
        base = prefill(eng, BASE)[0]
        with pytest.raises(SpliceError) as info:
            run_splice(eng, base, directives, strict=True)
        assert info.value.code is code
        eng.check(base)
        assert prefill(eng, BASE + QUERY, previous=base)[2] >= 20  # the strict failure left a usable handle


def test_canary_measures_a_small_nonzero_error(tiny1):
    eng = engine(tiny1, kv_type="float16")
    handle = prefill(eng, BASE)[0]
    errors = []
    original = eng.canary

    def spy(stage, positions, tokens):
        result = original(stage, positions, tokens)
        errors.append(result)
        return result

    eng.canary = spy
    run_splice(eng, handle, EDITS["one"])
    (result,) = errors
    assert result.ran and 0 < result.error < result.tolerance
