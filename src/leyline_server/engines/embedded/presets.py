"""Model presets (no download) and loading of local checkpoints into an :class:`EmbeddedEngine`.

Presets are tiny random models built from configs with fixed seeds, paired with the project's
tokenizer: ``tiny-mla`` (DeepSeek-V2 style MLA), ``tiny-mla-v3`` (DeepSeek-V3 style,
``rope_interleave=True``, YaRN) and ``tiny-gqa`` (Llama style GQA). Anything else is a path to a
local folder with ``config.json``, safetensors weights and a tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from leyline_server.engines.embedded.engine import EmbeddedEngine
from leyline_server.engines.embedded.pool import SlotPool, layout_from_config
from leyline_server.rope import rope_spec_from_config
from leyline_server.tiny_models import YARN, build_model, tiny_config

__all__ = ["PRESETS", "preset_config", "load_engine"]

PRESETS: dict[str, tuple[str, dict[str, Any] | None, dict[str, Any]]] = {
    "tiny-mla": ("deepseek_v2", None, {}),
    "tiny-mla-v3": ("deepseek_v3", YARN, {"rope_interleave": True}),
    "tiny-gqa": ("llama", None, {}),
}


def preset_config(name: str, layers: int = 2, **overrides: Any) -> Any:
    """The transformers config of preset ``name`` (``layers`` decoder layers)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}")
    model_type, rope, extra = PRESETS[name]
    return tiny_config(model_type, layers=layers, rope=rope, **{**extra, **overrides})


def load_engine(
    model: str,
    kv_budget_mb: float = 64.0,
    dtype: torch.dtype = torch.float32,
    layers: int = 2,
    seed: int = 0,
    name: str | None = None,
    max_context_tokens: int | None = None,
    prefix_cache: bool = True,
    **overrides: Any,
) -> tuple[EmbeddedEngine, Any]:
    """An engine and its tokenizer for a preset name or a local checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer

    if model in PRESETS:
        net = build_model(preset_config(model, layers=layers, **overrides), seed=seed, dtype=dtype)
        tokenizer = load_tiny_tokenizer()
    else:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ValueError(f"{model!r} is neither a preset ({sorted(PRESETS)}) nor a checkpoint folder")
        net = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    layout = layout_from_config(net.config)
    pool = SlotPool.from_budget(layout, kv_budget_mb, dtype=dtype)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    engine = EmbeddedEngine(
        net,
        pool,
        rope_spec_from_config(net.config),
        eos_token_ids=eos,
        name=name or model,
        max_context_tokens=max_context_tokens,
        prefix_cache=prefix_cache,
    )
    return engine, tokenizer
