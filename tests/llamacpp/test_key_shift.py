"""Moving cells through the state API (:class:`KeyShifter`) against llama.cpp's own ``seq_add`` path.

The fast path serialises only the moving cells, repositions them in host memory (keys rotated by
the exact difference of llama.cpp's RoPE phases) and restores them, so a splice no longer makes
llama.cpp re-rotate every cell of the pool. Oracles: llama.cpp's own keys of a token decoded at the
target position, the seq_add path (the slow one), and a fresh prefill on a one-layer model.
"""

from __future__ import annotations

import numpy as np
import pytest

from leyline_sdk.core.directives import Directive, apply
from leyline_server.engines.llamacpp.cache import LIFT_BUFFER_MAX
from leyline_server.engines.llamacpp.engine import CANARY_SEQS
from leyline_server.engines.llamacpp.lib import LlamaModel
from leyline_server.engines.llamacpp.shift import verified_shifter
from leyline_server.engines.llamacpp.state import StateBlob
from leyline_server.splice import FallbackCode, SpliceError
from tests.llamacpp.helpers import BASE, engine, fresh_logits, max_diff, prefill, run_splice
from tests.llamacpp.test_splice import EDITS, EXACT, QUERY, SCOPE_BLOCK

EDITS_AND_BLOCK = [*EDITS, "block"]


def _keys_at(eng, token: int, pos: int, seq: int = CANARY_SEQS[0]) -> StateBlob:
    eng.ctx.seq_rm(seq)
    assert eng.ctx.decode([(seq, token, pos)], want_logits=False) == 0
    blob = StateBlob.parse(eng.ctx.state_get(seq))
    eng.ctx.seq_rm(seq)
    return blob


@pytest.mark.parametrize("kv_type, tolerance", [("float32", 2e-6), ("float16", 2e-3), ("bfloat16", 2e-2)])
def test_shifted_keys_equal_llamacpps_own_keys_at_the_new_position(tiny2, kv_type, tolerance):
    eng = engine(tiny2, kv_type=kv_type)
    assert eng.shifter is not None
    for token, p0, p1 in [(17, 0, 4000), (300, 5000, 7), (901, 1234, 1235), (44, 9, 9)]:
        moved = _keys_at(eng, token, p0)
        eng.shifter.shift(moved, np.array([p1 - p0]))
        target = _keys_at(eng, token, p1)
        assert int(moved.positions[0]) == p1
        for layer in range(len(target.keys)):
            want = target.keys_f32(layer)
            error = float(np.abs(moved.keys_f32(layer) - want).max()) / float(np.abs(want).max())
            assert error < tolerance, (token, p0, p1, layer, error)
    eng.close()


def test_a_rope_the_shifter_gets_wrong_is_caught_at_start(tiny1, monkeypatch):
    model = LlamaModel(tiny1)
    eng = engine(tiny1)
    assert verified_shifter(model, eng.ctx, CANARY_SEQS[:2], 2e-3) is not None
    real_meta = LlamaModel.meta
    wrong_base = lambda self, key: "50000" if key.endswith("freq_base") else real_meta(self, key)  # noqa: E731
    monkeypatch.setattr(LlamaModel, "meta", wrong_base)
    assert verified_shifter(model, eng.ctx, CANARY_SEQS[:2], 2e-3) is None  # wrong frequencies
    monkeypatch.setattr(LlamaModel, "meta", real_meta)
    model.rope_type = 2  # NEOX pairs on a NORM model
    assert verified_shifter(model, eng.ctx, CANARY_SEQS[:2], 2e-3) is None
    model.rope_type = -1  # no RoPE at all: nothing to shift with
    assert verified_shifter(model, eng.ctx, CANARY_SEQS[:2], 2e-3) is None
    assert eng.ctx.pos_max(CANARY_SEQS[0]) == eng.ctx.pos_max(CANARY_SEQS[1]) == -1  # the check cleaned up
    eng.close()
    model.close()


def _spliced(path, edit: str, key_shift: bool):
    eng = engine(path)
    if not key_shift:
        eng.shifter = None
    blocks, directives = {}, EDITS.get(edit)
    if edit == "block":
        block_tokens = list(range(300, 340))
        blocks = {"b1": eng.prefill(block_tokens, SCOPE_BLOCK).handle}
        directives = [Directive(start=100, end=150, replacement=block_tokens, block="b1")]
    handle, report = run_splice(eng, prefill(eng, BASE)[0], directives, blocks=blocks)
    assert report.applied and report.canary == "passed", report
    assert not eng.ctx.shift_pending or not key_shift  # the fast path leaves nothing for llama.cpp to re-rotate
    eng.check(handle)
    new = apply(BASE, directives)
    logits = prefill(eng, new + QUERY, previous=handle)[1]
    eng.close()
    return new, logits


@pytest.mark.parametrize("edit", EDITS_AND_BLOCK)
def test_fast_moves_equal_seq_add_moves(tiny2, edit):
    _, fast = _spliced(tiny2, edit, key_shift=True)
    _, slow = _spliced(tiny2, edit, key_shift=False)
    assert max_diff(fast, slow) < 2e-4  # two layers: approximate KV, the same on both paths


@pytest.mark.parametrize("edit", EDITS_AND_BLOCK)
def test_the_seq_add_path_still_equals_a_fresh_prefill(tiny1, edit):
    new, logits = _spliced(tiny1, edit, key_shift=False)
    assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < EXACT


def test_fills_run_while_the_moved_cells_are_out_of_the_pool(tiny1):
    eng = engine(tiny1)
    seen = []
    original = eng.cache.decode

    def spy(seq, tokens, pos0, *args, **kwargs):
        seen.append((seq, pos0, eng.ctx.pos_max(seq)))  # the sequence ends right before the fill
        return original(seq, tokens, pos0, *args, **kwargs)

    base = prefill(eng, BASE)[0]
    eng.cache.decode = spy
    handle, report = run_splice(eng, base, EDITS["one"])
    assert report.applied and seen == [(handle.entry.seq, 20, 19)]
    eng.check(handle)
    eng.close()


@pytest.mark.parametrize("strict", [False, True])
def test_moved_cells_that_cannot_land_fall_back_cleanly(tiny1, strict):
    eng = engine(tiny1)
    handle = prefill(eng, BASE)[0]
    real_set = eng.ctx.state_set
    eng.ctx.state_set = lambda blob, seq: False  # the pool refuses the moved cells back
    eng.cache.make_room = lambda protect=(): False
    directives = EDITS["one"]
    new = apply(BASE, directives)
    if strict:
        with pytest.raises(SpliceError) as info:
            run_splice(eng, handle, directives, strict=True)
        assert info.value.code is FallbackCode.CAPACITY
        eng.check(handle)  # cut back to what the splice kept, and it says so
        assert handle.cached == directives[0].start and handle.tokens == BASE
        eng.ctx.state_set = real_set
        logits = prefill(eng, BASE + QUERY, previous=handle)[1]
        assert max_diff(logits, fresh_logits(tiny1, BASE + QUERY)) < 1e-4
    else:
        handle, report = run_splice(eng, handle, directives)
        assert report.fallback is not None and report.fallback.code == FallbackCode.CAPACITY
        eng.ctx.state_set = real_set
        eng.check(handle)
        logits = prefill(eng, new + QUERY, previous=handle)[1]
        assert max_diff(logits, fresh_logits(tiny1, new + QUERY)) < 1e-4  # a forget: a fresh prefill
    eng.close()


def test_splices_reuse_one_host_buffer_for_the_moved_cells(tiny1):
    eng = engine(tiny1)
    handle, _ = run_splice(eng, prefill(eng, BASE)[0], EDITS["one"])
    buffer = eng.cache.lift_buffer(1)
    assert buffer is not None and buffer.nbytes >= eng.ctx.state_size(handle.entry.seq) // 2  # sized by the move
    handle, report = run_splice(eng, handle, EDITS["two"])
    assert report.applied and eng.cache.lift_buffer(1) is buffer  # not reallocated: no fresh pages to fault in
    assert eng.cache.lift_buffer(LIFT_BUFFER_MAX + 1) is None  # huge moves allocate their own
    eng.check(handle)
    eng.close()
