"""Model presets and :func:`load_engine`: a model (see ``loading``) in an :class:`EmbeddedEngine`.

Tiny presets are random models built from configs with fixed seeds, paired with the project's
tokenizer: ``tiny-mla`` (DeepSeek-V2 style MLA), ``tiny-mla-v3`` (DeepSeek-V3 style,
``rope_interleave=True``, YaRN) and ``tiny-gqa`` (Llama style GQA). ``smollm2-135m`` is the real
SmolLM2-135M-Instruct; a ``.gguf`` file or a checkpoint folder is loaded as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from leyline_server.engines.embedded.engine import EmbeddedEngine
from leyline_server.engines.embedded.loading import check_servable, load_folder, load_gguf, resolve_model_path
from leyline_server.engines.embedded.pool import SlotPool, layout_from_config
from leyline_server.rope import rope_spec_from_config
from leyline_server.tiny_models import PRESETS, build_model, preset_config

__all__ = ["PRESETS", "preset_config", "load_engine"]


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
    """An engine and its tokenizer for a tiny preset, ``smollm2-135m``, a ``.gguf`` file or a folder.

    Raises :class:`~leyline_server.engines.embedded.loading.ModelLoadError` (a ``ValueError``)
    with what to do when the model cannot be found or served.
    """
    from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer

    if model in PRESETS:
        net = build_model(preset_config(model, layers=layers, **overrides), seed=seed, dtype=dtype)
        tokenizer = load_tiny_tokenizer()
    else:
        path = resolve_model_path(model)
        net, tokenizer = load_gguf(path, dtype) if path.suffix == ".gguf" else load_folder(path, dtype)
    check_servable(net.config)
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
