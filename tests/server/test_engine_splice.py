"""Engine-level oracles (docs/design.md §3): an amortize splice against a fresh prefill of the edited sequence."""

from __future__ import annotations

import pytest
import torch

from leyline_sdk.core.directives import Directive, apply
from leyline_sdk.core.fallbacks import SERVER_CODES
from leyline_server.contract.values import SamplingParams
from leyline_server.rope import RopeSpec
from leyline_server.splice import FallbackCode, SpliceError
from tests.server.engine_helpers import (
    PRESET_NAMES,
    engine,
    fresh,
    layer0_oracle_error,
    pool_rows,
    prefill,
    run_splice,
    with_spec,
)

BASE = [(37 * i + 11) % 1000 + 7 for i in range(80)]
EDITS = {
    "one": [Directive(start=20, end=45, replacement=[3, 4, 5, 6])],
    "two": [
        Directive(start=5, end=9, replacement=[]),
        Directive(start=30, end=50, replacement=[8, 9]),
    ],
    "three": [
        Directive(start=2, end=2, replacement=[10, 11, 12]),
        Directive(start=20, end=40, replacement=[13]),
        Directive(start=60, end=61, replacement=[14, 15, 16, 17]),
    ],
}


def spliced(name, directives, layers=1, query=(5,)):
    eng = engine(name, layers=layers)
    pinned, _, _ = prefill(eng, BASE)
    pinned, report = run_splice(eng, pinned, directives)
    eng.check_integrity()
    new = apply(BASE, directives)
    after, logits, reused = prefill(eng, new + list(query), previous=pinned)
    return eng, after, logits, report, reused


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("edit", list(EDITS))
def test_one_layer_splice_equals_fresh_prefill(name, edit):
    directives = EDITS[edit]
    new = apply(BASE, directives)
    eng, after, logits, report, reused = spliced(name, directives)
    assert report.applied and report.fallback is None
    assert report.rotated_tokens > 0
    assert report.prefilled_tokens == sum(len(d.replacement) for d in directives)
    assert reused == len(new)  # the continuation reuses the whole spliced sequence
    ref_eng, ref_pinned, _ = fresh(name, new + [5])
    ref_logits = prefill(ref_eng, new + [5])[1]
    cache = pool_rows(eng, after.slots[: len(new)])
    ref_cache = pool_rows(ref_eng, ref_pinned.slots[: len(new)])
    assert (cache - ref_cache).abs().max().item() <= 1e-4
    assert (logits - ref_logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_deeper_layers_keep_their_notes(name):
    directives = EDITS["one"]
    new = apply(BASE, directives)
    eng, after, _, report, _ = spliced(name, directives, layers=3)
    ref_eng, ref_pinned, _ = fresh(name, new, layers=3)
    downstream = slice(24, len(new))
    cache = pool_rows(eng, after.slots[: len(new)])[:, downstream]
    ref = pool_rows(ref_eng, ref_pinned.slots[: len(new)])[:, downstream]
    assert (cache[0] - ref[0]).abs().max().item() <= 1e-4  # layer 0: token + position only
    for layer in (1, 2):
        assert (cache[layer] - ref[layer]).abs().max().item() > 1e-3  # nothing silently recomputed
    assert layer0_oracle_error(eng, after) <= 1e-4


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("scattered", [False, True])
def test_the_fast_rotation_equals_the_reference_rotation(name, edit, scattered):
    """The engine's CPU fast path (slices, complex multiply) against the plain torch kernel, on
    three layers (the moved rows keep their notes) and with slots fresh (runs) or recycled."""
    rows = []
    for backend in ("torch", "auto"):
        eng = engine(name, layers=3)
        eng.rotate_backend = backend
        if scattered:  # holes in the pool: the session's rows (the moves' sources) land scattered
            junk = [prefill(eng, [i + 2] * 7)[0] for i in range(12)]
            for handle in junk[::2]:
                eng.release(handle)
            eng.pool.free(eng.radix.evict(10_000))
        pinned, report = run_splice(eng, prefill(eng, BASE)[0], EDITS[edit])
        assert report.applied and report.canary == "passed"
        eng.check_integrity()
        rows.append(pool_rows(eng, pinned.slots))
    # float noise only (a few ULPs per composed rotation; CPUs differ): a wrong angle or row is O(1)
    torch.testing.assert_close(rows[1], rows[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_forget_equals_fresh_prefill(name):
    directives = [Directive(start=20, end=45, replacement=[3, 4, 5, 6], mode="forget")]
    new = apply(BASE, directives)
    eng = engine(name, layers=2)
    pinned, _, _ = prefill(eng, BASE)
    pinned, report = run_splice(eng, pinned, directives)
    assert report.applied and report.rotated_tokens == 0 and report.reused_tokens == 20
    ref_eng, ref_pinned, _ = fresh(name, new, layers=2)
    torch.testing.assert_close(pool_rows(eng, pinned.slots), pool_rows(ref_eng, ref_pinned.slots), rtol=0, atol=1e-5)
    cont, logits, _ = prefill(eng, new + [9], previous=pinned)
    ref_cont, ref_logits, _ = prefill(ref_eng, new + [9], previous=ref_pinned)
    params = SamplingParams(max_tokens=8)
    assert [s.token for s in eng.decode(cont, logits, params)] == [
        s.token for s in ref_eng.decode(ref_cont, ref_logits, params)
    ]
    eng.check_integrity()


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_identity_edit_changes_nothing(name):
    eng = engine(name, layers=3)
    pinned, _, _ = prefill(eng, BASE)
    before = pool_rows(eng, pinned.slots).clone()
    pinned, report = run_splice(eng, pinned, [Directive(start=30, end=35, replacement=BASE[30:35])])
    assert report.applied and pinned.tokens == BASE
    torch.testing.assert_close(pool_rows(eng, pinned.slots), before, rtol=0, atol=1e-5)


def test_mixed_amortize_then_forget_recomputes_from_the_forget():
    directives = [
        Directive(start=10, end=20, replacement=[1, 2]),
        Directive(start=50, end=55, replacement=[3], mode="forget"),
    ]
    new = apply(BASE, directives)
    eng = engine("tiny-gqa", layers=1)
    pinned, _, _ = prefill(eng, BASE)
    pinned, report = run_splice(eng, pinned, directives)
    assert report.applied and report.rotated_tokens == 30  # base 20..50 moved
    assert report.prefilled_tokens == 2 + len(new) - (50 - 8)
    ref_eng, ref_pinned, _ = fresh("tiny-gqa", new)
    assert (pool_rows(eng, pinned.slots) - pool_rows(ref_eng, ref_pinned.slots)).abs().max() <= 1e-4


# -- fallbacks: each code provoked for real ---------------------------------------------------------
def _pinned(eng):
    return prefill(eng, BASE)[0]


def _provoke(code):
    eng = engine("tiny-mla", layers=1)
    good = [Directive(start=20, end=45, replacement=[3, 4])]
    kwargs = {}
    directives = good
    if code is FallbackCode.BASE_MISMATCH:
        kwargs["base_length"] = len(BASE) + 1
    elif code is FallbackCode.SPAN_INVALID:
        directives = [Directive(start=10, end=30), Directive(start=20, end=40)]
    elif code is FallbackCode.TOKEN_INVALID:
        directives = [Directive(start=10, end=30, replacement=[eng.info.vocab_size])]
    elif code is FallbackCode.PROMPT_MISMATCH:
        kwargs["prompt"] = BASE
    elif code is FallbackCode.ROPE_UNSUPPORTED:
        eng = with_spec(eng, RopeSpec(model_type="x", shiftable=False, reason="test: unshiftable"))
    elif code is FallbackCode.DRIFT_BUDGET:
        eng.rotation_budget = 0
    elif code is FallbackCode.CANARY_FAILED:
        eng = with_spec(eng, eng.spec.with_layout("half_split"))  # V2 caches interleaved: a wrong layout
    elif code is FallbackCode.CONTEXT_LENGTH:
        directives = [Directive(start=10, end=10, replacement=[5] * eng.info.max_context_tokens)]
    elif code is FallbackCode.CAPACITY:
        # room for 100 tokens: the pinned base (80) leaves 20, the splice needs 35 rotated + 2;
        # the forget fallback may evict the old branch and fits
        per_slot = eng.pool.layout.bytes_per_slot(eng.pool.dtype)
        eng = engine("tiny-mla", layers=1, kv_budget_mb=100 * per_slot / 2**20)
        assert eng.pool.capacity == 100
    return eng, directives, kwargs


@pytest.mark.parametrize("code", sorted(SERVER_CODES, key=lambda c: c.value))
def test_each_fallback_code_is_produced_and_strict_raises(code):
    eng, directives, kwargs = _provoke(code)
    pinned = _pinned(eng)
    new_pinned, report = run_splice(eng, pinned, directives, **kwargs)
    assert report.fallback is not None and report.fallback.code == code, report
    assert not report.applied and report.rotated_tokens == 0
    eng.check_integrity()
    if code is FallbackCode.CAPACITY:
        assert new_pinned.tokens == apply(BASE, directives)  # forget fits where the splice did not
    eng, directives, kwargs = _provoke(code)
    with pytest.raises(SpliceError) as info:
        run_splice(eng, _pinned(eng), directives, strict=True, **kwargs)
    assert info.value.code is code
    eng.check_integrity()


def test_fallback_forget_gives_the_fresh_result():
    eng, directives, kwargs = _provoke(FallbackCode.CANARY_FAILED)
    pinned, report = run_splice(eng, _pinned(eng), directives, **kwargs)
    assert report.fallback.code == FallbackCode.CANARY_FAILED
    new = apply(BASE, directives)
    ref_eng, ref_pinned, _ = fresh("tiny-mla", new)
    torch.testing.assert_close(pool_rows(eng, pinned.slots), pool_rows(ref_eng, ref_pinned.slots), rtol=0, atol=1e-5)
