"""Model presets and :func:`load_engine`: a model (see ``loading``) in an :class:`EmbeddedEngine`.

Tiny presets are random models built from configs with fixed seeds, paired with the project's
tokenizer: ``tiny-mla`` (DeepSeek-V2 style MLA), ``tiny-mla-v3`` (DeepSeek-V3 style,
``rope_interleave=True``, YaRN), ``tiny-gqa`` (Llama style GQA) and the sliding-window shapes
``tiny-gemma3`` and ``tiny-gptoss`` (:mod:`leyline_server.tiny_models`). ``smollm2-135m`` is the real
SmolLM2-135M-Instruct; a ``.gguf`` file or a checkpoint folder is loaded as it is.
"""

from __future__ import annotations

from typing import Any

import torch

from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.engine import EmbeddedEngine
from leyline_server.engines.embedded.loading import check_servable, load_folder, load_gguf, resolve_model_path
from leyline_server.engines.embedded.pool import SlotPool, layout_from_config
from leyline_server.engines.kv_budget import log_pool
from leyline_server.rope import rope_spec_from_config
from leyline_server.tiny_models import PRESETS, build_model, preset_config

__all__ = ["PRESETS", "preset_config", "load_engine"]


def load_engine(config: EngineConfig, seed: int = 0, **overrides: Any) -> tuple[EmbeddedEngine, Any]:
    """An engine and its tokenizer for ``config.model``: a tiny preset, ``smollm2-135m``, a ``.gguf``
    file or a folder (``overrides``: preset config fields, for tests).

    Raises :class:`~leyline_server.engines.embedded.loading.ModelLoadError` (a ``ValueError``)
    with what to do when the model cannot be found or served, and ``ValueError`` naming
    ``--kv-budget-mb`` when ``config.context_length`` does not fit the pool. Without a budget the
    pool is sized from the machine for the served context (:meth:`EngineConfig.kv_budget`).
    """
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

    dtype = getattr(torch, config.dtype)
    if config.model in PRESETS:
        net = build_model(preset_config(config.model, layers=config.preset_layers, **overrides), seed=seed, dtype=dtype)
        tokenizer = load_tiny_tokenizer()
    else:
        path = resolve_model_path(config.model)
        net, tokenizer = load_gguf(path, dtype) if path.suffix == ".gguf" else load_folder(path, dtype)
    check_servable(net.config)
    layout = layout_from_config(net.config)
    per_token = layout.bytes_per_slot(dtype)
    budget = config.kv_budget(int(getattr(net.config, "max_position_embeddings", 0) or 32_768), per_token)
    pool = SlotPool.from_budget(layout, budget.mb, dtype=dtype)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    engine = EmbeddedEngine(
        net,
        pool,
        rope_spec_from_config(net.config),
        eos_token_ids=eos,
        name=config.name,
        max_context_tokens=config.context_length,
        prefix_cache=config.prefix_cache,
        rotation_budget=config.rotation_budget,
        canary_tolerance=config.canary_tolerance,
    )
    log_pool(pool.capacity, per_token, budget.source)
    return engine, tokenizer
