"""Helpers for engine tests: build engines, compare a session's cache with a fresh prefill."""

from __future__ import annotations

import torch

from leyline_server.engines.embedded.cache_adapter import layer0_keys
from leyline_server.engines.embedded.engine import Engine, Pinned
from leyline_server.engines.embedded.presets import load_engine

PRESET_NAMES = ["tiny-mla", "tiny-mla-v3", "tiny-gqa"]


def engine(name: str, layers: int = 1, kv_budget_mb: float = 4.0, **kw) -> Engine:
    eng, _ = load_engine(name, kv_budget_mb=kv_budget_mb, layers=layers, **kw)
    return eng


def pool_rows(eng: Engine, slots: torch.Tensor) -> torch.Tensor:
    """[L, T, H, D] keys (plus values for GQA, concatenated on the last dim)."""
    keys = eng.pool.keys[:, slots]
    if eng.pool.values is not None:
        keys = torch.cat([keys, eng.pool.values[:, slots]], dim=-1)
    return keys


def fresh(name: str, tokens: list[int], layers: int = 1) -> tuple[Engine, Pinned, torch.Tensor]:
    """A new engine that prefilled ``tokens`` from nothing (the oracle)."""
    eng = engine(name, layers=layers)
    pinned, logits, _ = eng.prefill(tokens)
    return eng, pinned, logits


def layer0_oracle_error(eng: Engine, pinned: Pinned) -> float:
    """Max relative error between the cached layer-0 rows and the model's own layer-0 keys."""
    n = len(pinned.slots)
    if n == 0:  # an empty session (everything deleted) has nothing to compare
        return 0.0
    expected = layer0_keys(eng.model, pinned.tokens[:n], torch.arange(n), eng.pool.layout.mla_latent)
    actual = eng.pool.keys[0].index_select(0, pinned.slots).float()
    return (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)
