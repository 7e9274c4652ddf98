"""The real Gemma 3 270M (``make models`` fetches it: ``leyline-models fetch gemma3-270m``) on both CPU engines.

Its 18 layers are 5 sliding-window (512 positions, RoPE base 10k) to 1 global (base 1M). Oracles:
the model's own keys at the new positions for a δ-rotation of every layer (a uniform shift keeps
every hidden state, so each layer's keys at positions + δ are the model's own), transformers'
``generate`` for the embedded engine's tokens past the window, and the same turns with no splice
asked for on a second engine for the llama.cpp engine's fallback (it keeps only the window's rows
of local layers, so it does not splice).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope, SamplingParams
from leyline_server.kernels import rotate_copy
from leyline_server.models import resolve_real_model
from leyline_server.rope import rope_spec_from_config
from tests.server.engine_helpers import prefill

pytestmark = pytest.mark.slow
KINDS = (["sliding_attention"] * 5 + ["full_attention"]) * 3
PROMPT = [int(t) for t in np.random.default_rng(0).integers(1000, 20000, 700)]  # past the 512 window


@pytest.fixture(scope="module")
def gguf():
    return resolve_real_model("gemma3-270m")  # ModelNotFetched says what to run


@pytest.fixture(scope="module")
def model(gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def _cache_rows(model, ids: list[int], positions: torch.Tensor) -> torch.Tensor:
    """Every layer's cached keys ``[L, T, H, D]``, a full cache (local layers keep every row)."""
    from transformers import DynamicCache

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), position_ids=positions[None], use_cache=True, cache=DynamicCache())
    return torch.stack([layer.keys[0].transpose(0, 1) for layer in out.cache.layers]).contiguous()


def test_the_layer_kinds_and_bases_are_the_models(model):
    spec = rope_spec_from_config(model.config)
    assert list(model.config.layer_types) == KINDS
    assert [layer.window for layer in spec.layers] == [512 if k == "sliding_attention" else None for k in KINDS]
    head = model.config.head_dim
    bases = sorted({layer.inv_freq[1] ** (-head / 2) for layer in spec.layers})  # inv_freq[1] = base^(-2/head)
    assert bases == pytest.approx([10_000, 1_000_000], rel=1e-4)


def test_every_layer_rotates_to_the_models_own_keys(model):
    spec = rope_spec_from_config(model.config)
    ids, old = PROMPT[:24], torch.arange(100, 124)
    new = old + 1_000
    rows, expected = _cache_rows(model, ids, old), _cache_rows(model, ids, new)
    wrong = rows.clone()
    slots = torch.arange(len(ids))
    rotate_copy(rows, slots, slots, old, new, spec)
    rotate_copy(wrong, slots, slots, old, new, spec.for_layer(0).model_copy(update={"layers": ()}))
    scale = expected.abs().amax(dim=(1, 2, 3))
    err = (rows - expected).abs().amax(dim=(1, 2, 3)) / scale
    assert err.max().item() <= 1e-4, err
    global_layer = KINDS.index("full_attention")
    assert (wrong[global_layer] - expected[global_layer]).abs().max().item() / scale[global_layer].item() > 0.1


def test_the_embedded_engine_serves_it_as_transformers_does_past_the_window(model):
    from leyline_server.engines.embedded.engine import EmbeddedEngine
    from leyline_server.engines.embedded.pool import SlotPool, layout_from_config

    pool = SlotPool.from_budget(layout_from_config(model.config), 64, dtype=torch.float32)
    engine = EmbeddedEngine(model, pool, rope_spec_from_config(model.config), eos_token_ids=[])
    pinned, logits, _ = prefill(engine, PROMPT)
    ours = [s.token for s in engine.decode(pinned, logits, SamplingParams(max_tokens=8, ignore_eos=True))]
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert ours == out[0, len(PROMPT) :].tolist()
    # and a splice that pulls rows back into the window passes its canary and is reported
    directives = [Directive(start=150, end=650, replacement=[])]
    from tests.server.engine_helpers import run_splice

    pinned, report = run_splice(engine, pinned, directives)
    assert report.applied and report.canary == "passed" and report.rotated_tokens > 0
    engine.check_integrity()


def test_the_llamacpp_engine_serves_its_splices_as_forget(gguf):
    from leyline_server.engines.llamacpp.engine import LlamaCppEngine
    from leyline_server.engines.llamacpp.lib import LlamaModel
    from tests.llamacpp.helpers import run_splice

    def engine() -> LlamaCppEngine:
        return LlamaCppEngine(LlamaModel(gguf), n_ctx=2048, kv_type="float32", threads=(2, 2))

    eng, ref = engine(), engine()
    try:
        assert not eng.info.shiftable and "sliding-window layers (window 512)" in (eng.info.unshiftable_reason or "")
        directives = [Directive(start=150, end=650, replacement=[])]
        handle = eng.prefill(PROMPT, CacheScope(private="s")).handle
        handle, report = run_splice(eng, handle, directives)
        assert not report.applied and report.fallback is not None and report.fallback.code == "rope_unsupported"
        assert report.rotated_tokens == report.approximate_tokens == 0 and report.reused_tokens == 150
        new = apply(PROMPT, directives)
        got = eng.prefill(new + [7], CacheScope(private="s"), previous=handle)
        assert got.reused == 200  # the untouched head and the 50 tokens recomputed after the edit
        # the oracle: the same turns with no splice asked for (the new prompt after the old one
        # reuses its untouched head and prefills the rest), so the same batches, the same logits
        old = ref.prefill(PROMPT, CacheScope(private="s")).handle
        head = ref.prefill(new, CacheScope(private="s"), previous=old)
        assert head.reused == 150
        want = ref.prefill(new + [7], CacheScope(private="s"), previous=head.handle)
        assert np.abs(want.last_logits - got.last_logits).max() < 1e-3
    finally:
        eng.close()
        ref.close()
