"""rotate_copy_layers (per-layer buffers, as SGLang keeps them) against rotate_copy_torch on one pool tensor."""

from __future__ import annotations

import pytest
import torch

from leyline_server.kernels import rotate_copy_layers, rotate_copy_torch
from leyline_server.rope import PairLayout, RopeSpec

CASES = [
    ("mla", 1, 48, RopeSpec.plain(32, 16, PairLayout.INTERLEAVED)),  # [latent 32 | k_pe 16]
    ("gqa", 2, 16, RopeSpec.plain(0, 16, PairLayout.HALF_SPLIT)),
    ("partial", 2, 16, RopeSpec.plain(0, 8, PairLayout.HALF_SPLIT)),
]


def _pools(heads: int, dim: int, layers: int = 3, slots: int = 64, dtype=torch.float32):
    torch.manual_seed(0)
    stacked = torch.randn(layers, slots, heads, dim).to(dtype)
    return stacked, [stacked[i].clone() for i in range(layers)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("name", "heads", "dim", "spec"), CASES)
def test_equals_the_single_pool_oracle(name, heads, dim, spec, backend):
    keys, layer_keys = _pools(heads, dim)
    values, layer_values = _pools(heads, 8)
    src, dst = torch.arange(5, 25), torch.arange(30, 50)
    old, new = torch.arange(100, 120), torch.arange(7, 27)
    rotate_copy_torch(keys, src, dst, old, new, spec, values=values)
    rotate_copy_layers(layer_keys, src, dst, old, new, spec, values=layer_values, backend=backend)
    atol = 0 if backend == "torch" else 1e-5
    for layer in range(keys.shape[0]):
        torch.testing.assert_close(layer_keys[layer], keys[layer], rtol=0, atol=atol)
        torch.testing.assert_close(layer_values[layer], values[layer], rtol=0, atol=0)


def test_in_place_and_bf16():
    keys, layer_keys = _pools(1, 48, dtype=torch.bfloat16)
    spec = CASES[0][3]
    slots = torch.arange(3, 9)
    old, new = torch.arange(50, 56), torch.arange(2, 8)
    rotate_copy_torch(keys, slots, slots, old, new, spec)
    rotate_copy_layers(layer_keys, slots, slots, old, new, spec)
    for layer in range(keys.shape[0]):
        assert torch.equal(layer_keys[layer], keys[layer])


def test_refuses_mismatched_layers_and_overlap():
    spec = CASES[1][3]
    _, layer_keys = _pools(2, 16)
    one = torch.arange(4)
    with pytest.raises(ValueError, match="differs"):
        rotate_copy_layers([layer_keys[0], layer_keys[1][:, :1]], one, one + 10, one, one, spec)
    with pytest.raises(ValueError, match="disjoint"):
        rotate_copy_layers(layer_keys, one, one + 2, one, one, spec)
    with pytest.raises(ValueError, match="at least one layer"):
        rotate_copy_layers([], one, one + 10, one, one, spec)
