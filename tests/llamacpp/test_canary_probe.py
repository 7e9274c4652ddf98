"""The canary's reference keys from a context that stops after layer 0 (:class:`KeyProbe`).

Oracle: the keys of the same tokens decoded through every layer of the engine's own context at the
same positions (:func:`reference_keys`, the canary's reference before the probe): equal bit for
bit, for every KV dtype. The probe must really stop after layer 0 (its later layers' keys are
never written), a probe that disagrees is not used, and a splice that left a ``seq_add``
re-rotation pending is still checked with a decode in the pool, which applies it first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from leyline_server.engines.llamacpp import canary
from leyline_server.engines.llamacpp.canary import KeyProbe, reference_keys, verified_probe
from leyline_server.engines.llamacpp.engine import CANARY_SEQS
from leyline_server.engines.llamacpp.state import StateBlob
from tests.llamacpp.helpers import BASE, engine, prefill, run_splice
from tests.llamacpp.test_splice import EDITS

CASES = [([0, 17, 2500, 4095], [5, 900, 33, 33]), ([7, 8], [101, 102]), ([3000], [1])]


@pytest.mark.parametrize("kv_type", ["float32", "float16", "bfloat16"])
def test_the_probe_gives_exactly_the_keys_of_a_full_decode(tiny2, kv_type):
    eng = engine(tiny2, kv_type=kv_type)
    probe = eng.probe
    assert probe is not None
    for positions, tokens in CASES:
        stops = probe.stops
        got = probe.keys(positions, tokens)
        want = reference_keys(eng.cache, positions, tokens, CANARY_SEQS)
        assert got is not None and want is not None and got.shape == want.shape == (len(tokens), got.shape[1])
        assert np.array_equal(got, want), (positions, tokens)
        assert probe.stops == stops + 1  # the decode stopped after layer 0's keys
        other = probe.keys(positions, [t + 1 for t in tokens])
        assert other is not None and not np.allclose(other, want)  # the keys depend on the tokens
    assert probe.ctx.pos_max(0) == -1  # nothing stays in the probe's pool
    eng.close()


def test_the_probe_computes_nothing_past_layer_0(tiny2):
    eng = engine(tiny2)
    probe = KeyProbe(eng.model, eng.ctx.config, 1)
    assert probe.ctx.decode([(0, 55, 300)], want_logits=False) == 0
    state = StateBlob.parse(probe.ctx.state_get(0))
    full = StateBlob.parse(_decoded(eng, 55, 300))
    assert np.array_equal(state.keys_f32(0), full.keys_f32(0))
    assert np.abs(full.keys_f32(1)).max() > 0 and not np.array_equal(state.keys_f32(1), full.keys_f32(1))
    probe.close()
    eng.close()


def _decoded(eng, token: int, pos: int) -> np.ndarray:
    seq = CANARY_SEQS[0]
    assert eng.ctx.decode([(seq, token, pos)], want_logits=False) == 0
    blob = eng.ctx.state_get(seq).copy()
    eng.ctx.seq_rm(seq)
    return blob


def test_a_probe_that_disagrees_is_not_used(tiny1):
    eng = engine(tiny1)
    assert verified_probe(eng.model, eng.cache, CANARY_SEQS) is not None
    eng.ctx.config = dataclasses.replace(eng.ctx.config, kv_type="float16")  # the probe would round its keys
    assert verified_probe(eng.model, eng.cache, CANARY_SEQS) is None
    assert all(eng.ctx.pos_max(seq) == -1 for seq in CANARY_SEQS)  # the check cleaned up
    eng.close()


@pytest.mark.parametrize("key_shift", [True, False])
def test_a_pending_seq_add_is_checked_by_a_decode_in_the_pool(tiny1, monkeypatch, key_shift):
    eng = engine(tiny1)
    if not key_shift:
        eng.shifter = None  # runs move with seq_add: llama.cpp re-rotates them at the next decode
    used = []
    real_probe, real_reference = eng.probe.keys, canary.reference_keys
    monkeypatch.setattr(eng.probe, "keys", lambda *a: used.append("probe") or real_probe(*a))
    monkeypatch.setattr(canary, "reference_keys", lambda *a: used.append("decode") or real_reference(*a))
    # no fill: nothing decodes in the pool before the canary
    handle, report = run_splice(eng, prefill(eng, BASE)[0], EDITS["delete-only"])
    assert report.applied and report.canary == "passed", report
    assert used == (["probe"] if key_shift else ["decode"])
    eng.check(handle)
    eng.close()
