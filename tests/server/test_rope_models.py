"""RopeSpec against the models themselves: a key the model cached at position p, rotated to p',
equals the key the same model caches at p' (tiny random transformers models, fp32).

Layer-0 keys depend only on the token and its position, so for layer 0 any re-positioning must
match; under a uniform shift attention is shift-invariant, so every layer must match.
"""

from __future__ import annotations

import pytest
import torch

from leyline_server.kernels import rotate_copy
from leyline_server.rope import PairLayout, rope_spec_from_config
from leyline_server.tiny_models import LINEAR, LLAMA3, YARN, build_model, tiny_config

YARN_DEEPSEEK = {**YARN, "mscale": 0.707, "mscale_all_dim": 0.707}

CASES = {
    "deepseek_v2": ("deepseek_v2", None, {}),
    "deepseek_v2-yarn": ("deepseek_v2", YARN_DEEPSEEK, {}),
    "deepseek_v3-interleave-yarn": ("deepseek_v3", YARN, {"rope_interleave": True}),
    "deepseek_v3-no-interleave": ("deepseek_v3", None, {"rope_interleave": False}),
    "llama": ("llama", None, {}),
    "llama-llama3": ("llama", LLAMA3, {}),
    "llama-linear": ("llama", LINEAR, {}),
    "mistral": ("mistral", None, {}),
    "qwen2": ("qwen2", None, {}),
    "qwen3": ("qwen3", None, {}),
    "gpt_neox-partial": ("gpt_neox", None, {}),
    "mixtral": ("mixtral", None, {}),
    "qwen2_moe": ("qwen2_moe", None, {}),
    "qwen3_moe": ("qwen3_moe", None, {}),
    "olmo": ("olmo", None, {}),
    "olmo2": ("olmo2", None, {}),
    "granite": ("granite", LINEAR, {}),
    "phi3-partial": ("phi3", None, {}),
    "stablelm-partial": ("stablelm", None, {}),
    "gemma": ("gemma", None, {}),
    # sliding-window shapes: local and global layers alternate (so that three layers hold both)
    "gemma2-windowed": ("gemma2", None, {}),
    "gemma3_text-two-bases": ("gemma3_text", None, {"sliding_window_pattern": 2}),
    "gpt_oss-sinks-yarn": ("gpt_oss", None, {}),
}


def cached_pool(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The model's cache as a slot pool ``[L, T, H, D]`` (MLA rows: ``[latent | k_pe]``)."""
    from transformers import DynamicCache

    with torch.no_grad():  # a cache of full layers: a sliding-window layer's keeps every row too
        out = model(input_ids=ids[None], position_ids=positions[None], use_cache=True, cache=DynamicCache())
    cache = out.cache
    layers = []
    for layer in cache.layers:
        if model.config.model_type.startswith("deepseek"):
            row = torch.cat([layer.keys, layer.values], dim=-1)  # latent | k_pe
        else:
            row = layer.keys
        layers.append(row[0].transpose(0, 1))  # [T, H, D]
    return torch.stack(layers).contiguous()


def shifted_matches(name, layers, old_pos, new_pos, mutate_spec=None, post=None):
    model_type, rope, extra = CASES[name]
    config = tiny_config(model_type, layers=layers, rope=rope, **extra)
    model = build_model(config, seed=1)
    spec = rope_spec_from_config(config)
    assert spec.shiftable, spec.reason
    if mutate_spec:
        spec = mutate_spec(spec)
    ids = torch.randint(0, config.vocab_size, (len(old_pos),), generator=torch.Generator().manual_seed(3))
    pool = cached_pool(model, ids, old_pos)
    expected = cached_pool(model, ids, new_pos)
    slots = torch.arange(len(old_pos))
    rotate_copy(pool, slots, slots, old_pos, new_pos, spec)
    if post:
        post(pool, spec)
    return pool, expected, spec


OLD = torch.tensor(sorted(torch.randperm(3000, generator=torch.Generator().manual_seed(0))[:24].tolist()))
NEW = OLD + torch.randint(-OLD.min().item(), 2000, (24,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(CASES))
def test_layer0_key_rotated_equals_model_key(name):
    pool, expected, spec = shifted_matches(name, 1, OLD, NEW)
    err = (pool - expected).abs().max().item()
    assert err <= 2e-5 * expected.abs().max().item(), err
    assert spec.rotary_dim > 0


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v2-yarn",
        "deepseek_v3-interleave-yarn",
        "llama-llama3",
        "qwen3",
        "phi3-partial",
        "olmo2",
        "gemma2-windowed",
        "gemma3_text-two-bases",
        "gpt_oss-sinks-yarn",
    ],
)
def test_uniform_shift_matches_every_layer(name):
    old = torch.arange(40, 60)
    pool, expected, _ = shifted_matches(name, 3, old, old + 1234)
    torch.testing.assert_close(pool, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3-interleave-yarn", "llama", "gpt_neox-partial"])
def test_wrong_pair_layout_is_caught(name):
    def flip(spec):
        other = PairLayout.HALF_SPLIT if spec.layout is PairLayout.INTERLEAVED else PairLayout.INTERLEAVED
        return spec.with_layout(other)

    pool, expected, _ = shifted_matches(name, 1, OLD, NEW, mutate_spec=flip)
    assert (pool - expected).abs().max().item() > 1e-2 * expected.abs().max().item()


def test_double_mscale_is_caught():
    def double_mscale(pool, spec):
        lo = spec.rotary_offset
        pool[..., lo : lo + spec.rotary_dim] *= spec.attention_scaling

    pool, expected, spec = shifted_matches("deepseek_v3-interleave-yarn", 1, OLD, NEW, post=double_mscale)
    assert spec.attention_scaling > 1.05
    assert (pool - expected).abs().max().item() > 1e-2 * expected.abs().max().item()


def test_specs_record_layout_slice_and_scaling():
    v2 = rope_spec_from_config(tiny_config("deepseek_v2"))
    assert (v2.layout, v2.rotary_offset, v2.rotary_dim) == (PairLayout.INTERLEAVED, 32, 16)
    v3 = rope_spec_from_config(tiny_config("deepseek_v3", rope=YARN))
    assert (v3.layout, v3.rotary_offset, v3.rope_type) == (PairLayout.HALF_SPLIT, 32, "yarn")
    neox = rope_spec_from_config(tiny_config("gpt_neox"))
    assert (neox.rotary_offset, neox.rotary_dim) == (0, 4)  # 25% of a 16-dim head


@pytest.mark.parametrize(
    "config, reason",
    [
        (
            lambda: tiny_config("llama", rope={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
            "dynamic",
        ),
        (
            lambda: tiny_config(
                "llama",
                rope={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0] * 8,
                    "long_factor": [2.0] * 8,
                    "original_max_position_embeddings": 1024,
                },
            ),
            "longrope",
        ),
        (lambda: __import__("transformers").GPT2Config(), "absolute"),
        (lambda: __import__("transformers").AutoConfig.for_model("falcon"), "unknown model type"),
    ],
)
def test_unshiftable_configs_report_a_reason(config, reason):
    spec = rope_spec_from_config(config())
    assert not spec.shiftable
    assert reason in spec.reason


def test_alibi_shifts_for_free():
    from transformers import BloomConfig

    spec = rope_spec_from_config(BloomConfig())
    assert spec.shiftable and spec.rotary_dim == 0


def test_each_layer_rotates_with_its_own_base():
    """Gemma 3's global layers use base 1M, its local ones 10k: layer 1 (global) rotated with
    layer 0's frequencies misses the model's own key by O(1); with its own it matches."""
    old = torch.arange(40, 60)

    def layer0_everywhere(spec):
        return spec.model_copy(update={"layers": ()})

    right, expected, spec = shifted_matches("gemma3_text-two-bases", 2, old, old + 1234)
    wrong, _, _ = shifted_matches("gemma3_text-two-bases", 2, old, old + 1234, mutate_spec=layer0_everywhere)
    assert [layer.window for layer in spec.layers] == [8, None]
    assert spec.layers[0].inv_freq != spec.layers[1].inv_freq
    torch.testing.assert_close(right, expected, rtol=1e-4, atol=1e-4)
    assert (wrong[1] - expected[1]).abs().max().item() > 0.1
    torch.testing.assert_close(wrong[0], expected[0], rtol=1e-4, atol=1e-4)


def test_layer_kinds_are_read_from_the_config():
    gemma3 = rope_spec_from_config(tiny_config("gemma3_text", layers=6, sliding_window=512))
    assert [layer.window for layer in gemma3.layers] == [512] * 5 + [None]
    bases = {round(1 / layer.inv_freq[1] ** (16 / 2)) for layer in gemma3.layers}  # inv_freq[1] = base^(-2/16)
    assert bases == {10_000, 1_000_000}
    assert [(a, b) for a, b, _ in gemma3.layer_runs(6)] == [(0, 5), (5, 6)]
    oss = rope_spec_from_config(tiny_config("gpt_oss", layers=4))
    assert [(layer.window, layer.sinks) for layer in oss.layers] == [(8, True), (None, True)] * 2
    assert oss.rope_type == "yarn" and [(a, b) for a, b, _ in oss.layer_runs(4)] == [(0, 4)]
    assert rope_spec_from_config(tiny_config("llama", layers=3)).layers == ()  # nothing per layer to say
    with pytest.raises(ValueError, match="describes 6 layers"):
        gemma3.layer_runs(2)
