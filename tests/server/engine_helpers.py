"""Helpers for engine tests: build engines, run splices, compare a session's cache with a fresh prefill."""

from __future__ import annotations

import torch

from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.cache_adapter import layer0_keys
from leyline_server.engines.embedded.engine import EmbeddedEngine, Pinned
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.rope import RopeSpec
from leyline_server.splice import splice

PRESET_NAMES = ["tiny-mla", "tiny-mla-v3", "tiny-gqa"]
SCOPE = CacheScope(private="test-session")


def engine(name: str, layers: int = 1, kv_budget_mb: float = 4.0, **kw) -> EmbeddedEngine:
    eng, _ = load_engine(EngineConfig(model=name, kv_budget_mb=kv_budget_mb, preset_layers=layers), **kw)
    return eng


def with_spec(eng: EmbeddedEngine, spec: RopeSpec) -> EmbeddedEngine:
    """A new engine over the same model with another RoPE spec (an empty pool of the same size)."""
    from leyline_server.engines.embedded.pool import SlotPool

    pool = SlotPool(eng.pool.layout, eng.pool.capacity, eng.pool.dtype)
    return EmbeddedEngine(eng.model, pool, spec, eng.info.eos_token_ids)


def prefill(eng: EmbeddedEngine, tokens, previous=None, scope: CacheScope = SCOPE):
    """(pinned, last logits, reused) — the engine's prefill in the test scope."""
    result = eng.prefill(tokens, scope, previous=previous)
    return result.handle, result.last_logits, result.reused


def run_splice(
    eng: EmbeddedEngine, pinned, directives, base_length=None, base_digest=None, prompt=None, strict=False, blocks=None
):
    """The executor on the embedded engine: (new pinned, report)."""
    return splice(eng, pinned, SpliceRequest(directives, base_length, base_digest, strict, prompt, blocks or {}))


def pool_rows(eng: EmbeddedEngine, slots: torch.Tensor) -> torch.Tensor:
    """[L, T, H, D] keys (plus values for GQA, concatenated on the last dim)."""
    keys = eng.pool.keys[:, slots]
    if eng.pool.values is not None:
        keys = torch.cat([keys, eng.pool.values[:, slots]], dim=-1)
    return keys


def fresh(name: str, tokens: list[int], layers: int = 1) -> tuple[EmbeddedEngine, Pinned, torch.Tensor]:
    """A new engine that prefilled ``tokens`` from nothing (the oracle)."""
    eng = engine(name, layers=layers)
    pinned, logits, _ = prefill(eng, tokens)
    return eng, pinned, logits


def layer0_oracle_error(eng: EmbeddedEngine, pinned: Pinned) -> float:
    """Max relative error between the cached layer-0 rows and the model's own layer-0 keys."""
    n = len(pinned.slots)
    if n == 0:  # an empty session (everything deleted) has nothing to compare
        return 0.0
    expected = layer0_keys(eng.model, pinned.tokens[:n], torch.arange(n), eng.pool.layout.mla_latent)
    actual = eng.pool.keys[0].index_select(0, pinned.slots).float()
    return (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)
