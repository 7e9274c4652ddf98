"""Seam repair and block placement against the exact oracle: a fresh prefill of the edited sequence."""

from __future__ import annotations

import pytest

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope
from leyline_server.splice import FallbackCode
from tests.server.engine_helpers import PRESET_NAMES, engine, fresh, pool_rows, prefill, run_splice

BASE = [(37 * i + 11) % 1000 + 7 for i in range(80)]
BLOCK = [(53 * i + 5) % 1000 + 7 for i in range(25)]


def open_block(eng, tokens=BLOCK):
    """A block: its tokens prefilled alone at [0, n), pinned in its own scope."""
    return eng.prefill(tokens, CacheScope(private="block:b")).handle


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_repaired_tokens_equal_a_fresh_prefill_at_every_layer(name):
    directives = [Directive(start=20, end=45, replacement=[3, 4, 5, 6], repair=5)]
    new = apply(BASE, directives)
    eng = engine(name, layers=3)
    pinned, _, _ = prefill(eng, BASE)
    pinned, report = run_splice(eng, pinned, directives)
    assert report.applied and report.prefilled_tokens == 4 + 5  # R and the repair
    assert report.rotated_tokens == len(BASE) - 45 - 5
    ref_eng, ref_pinned, _ = fresh(name, new, layers=3)
    repaired = slice(24, 29)  # the five tokens after R, in new positions
    got = pool_rows(eng, pinned.slots)[:, repaired]
    want = pool_rows(ref_eng, ref_pinned.slots)[:, repaired]
    assert (got - want).abs().max().item() <= 1e-4  # fresh KV at every layer
    after = slice(29, 40)
    deep = (pool_rows(eng, pinned.slots)[1:, after] - pool_rows(ref_eng, ref_pinned.slots)[1:, after]).abs().max()
    assert deep.item() > 1e-3  # beyond the repair: rotated, the notes kept
    assert pinned.exact == 29
    eng.check_integrity()


@pytest.mark.parametrize("name", PRESET_NAMES)
@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_placed_block_equals_a_fresh_prefill_on_a_one_layer_model(name, where):
    eng = engine(name, layers=1)
    block = open_block(eng)
    at = 30 if where == "middle" else len(BASE)
    directives = [Directive(start=at, end=at, block="b")]  # the server fills in the block's tokens
    new = apply(BASE, [Directive(start=at, end=at, replacement=BLOCK)])
    pinned, _, _ = prefill(eng, BASE)
    pinned, report = run_splice(eng, pinned, directives, blocks={"b": block})
    assert report.applied and report.canary == "passed", report
    assert pinned.tokens == new
    cont, logits, reused = prefill(eng, new + [5], previous=pinned)
    assert reused == len(new)
    ref_eng, ref_pinned, ref_logits = fresh(name, new + [5])
    n = len(new)
    assert (pool_rows(eng, cont.slots[:n]) - pool_rows(ref_eng, ref_pinned.slots[:n])).abs().max().item() <= 1e-4
    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert eng.pool.rotations[block.slots].max().item() == 0  # the block itself is untouched
    eng.release(block)
    eng.check_integrity()


def test_an_unknown_block_falls_back_and_the_prompt_is_prefilled():
    eng = engine("tiny-gqa", layers=1)
    pinned, _, _ = prefill(eng, BASE)
    prompt = BASE + BLOCK
    pinned, report = run_splice(eng, pinned, [Directive(start=80, end=80, block="nope")], prompt=prompt)
    assert report.fallback is not None and report.fallback.code == FallbackCode.SPAN_INVALID
    assert "nope" in report.fallback.message and pinned.tokens == prompt
    wrong = [Directive(start=80, end=80, replacement=[1, 2], block="b")]
    pinned2, report = run_splice(eng, prefill(eng, BASE)[0], wrong, blocks={"b": open_block(eng)})
    assert report.fallback.code == FallbackCode.SPAN_INVALID and "differs" in report.fallback.message
