"""Tiny random transformers models built from configs with fixed seeds (no download).

Tests, benchmarks and the demo need real model code without weights. These configs keep every
architectural feature that matters to a splice (MLA latent + k_pe, GQA heads, partial rotary,
YaRN/llama3/linear scaling, sliding-window layers with their own RoPE base, attention sinks) at toy
sizes. ``initializer_range=0.2``: at the default 0.02 the
logits are so flat that broken variants look correct.

    model = build_model(tiny_config("deepseek_v2", layers=1))
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["tiny_config", "build_model", "preset_config", "PRESETS", "YARN", "LLAMA3", "LINEAR"]

_VOCAB = 1024  # the size of leyline_sdk's tiny tokenizer

YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 2048,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}
LLAMA3: dict[str, Any] = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 512,
}
LINEAR: dict[str, Any] = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}

_MLA = dict(
    num_key_value_heads=4,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=16,
    first_k_dense_replace=1_000,
    moe_intermediate_size=32,
    n_routed_experts=4,
)
_FAMILY: dict[str, dict[str, Any]] = {
    "deepseek_v2": _MLA,
    "deepseek_v3": {**_MLA, "rope_interleave": True},
    "llama": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": None},
    "qwen2": {"num_key_value_heads": 2},
    "qwen3": {"num_key_value_heads": 2, "head_dim": 16},
    "gpt_neox": {"rotary_pct": 0.25},
    "mixtral": {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2_moe": {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen3_moe": {
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "olmo": {"num_key_value_heads": 2},
    "olmo2": {"num_key_value_heads": 2},
    "granite": {"num_key_value_heads": 2},
    "phi3": {"num_key_value_heads": 2, "partial_rotary_factor": 0.5, "pad_token_id": 0, "eos_token_id": 2},
    "stablelm": {"num_key_value_heads": 2, "partial_rotary_factor": 0.25},
    "gemma": {"num_key_value_heads": 2, "head_dim": 32},
    # local layers see the last 8 positions; Gemma 3: local RoPE base 10k, global 1M (its defaults)
    "gemma2": {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8},
    "gemma3_text": {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16},
    "gpt_oss": {
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 131072,  # YaRN factor 32 over 4,096 original positions
    },
}


def tiny_config(model_type: str, layers: int = 1, rope: dict[str, Any] | None = None, **overrides: Any) -> Any:
    """A transformers config of ``model_type`` at toy size (hidden 64, 4 heads, vocab 1024)."""
    from transformers import AutoConfig

    if model_type not in _FAMILY:
        raise ValueError(f"no tiny config for {model_type!r}; known: {sorted(_FAMILY)}")
    kwargs: dict[str, Any] = dict(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=8192,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    kwargs.update(_FAMILY[model_type])
    if rope is not None:
        kwargs["rope_parameters"] = dict(rope)
    kwargs.update(overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    return config


def build_model(config: Any, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A randomly initialised causal LM for ``config`` (deterministic for a seed), in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    odds = getattr(config, "leyline_end_odds", None)
    if odds:
        _end_often(model, float(odds))
    return model.eval()


def _end_often(model: torch.nn.Module, odds: float) -> None:
    """Make a sampled reply end after ``1 / odds`` tokens on average, whatever the context.

    A random model almost never samples the end of its turn, and agent clients wait for one (a
    reply cut by a length limit is an error to Codex). One residual dimension is made a large
    constant (every token's embedding), so that after the final norm it dominates the hidden state;
    the output head reads only that dimension for the end token, with the weight that gives it
    probability ``odds`` against a uniform rest. Greedy decoding then ends at once: this preset is
    for sampling clients.
    """
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

    end = load_tiny_tokenizer().convert_tokens_to_ids("<|im_end|>")
    embed: torch.Tensor = model.get_input_embeddings().weight  # type: ignore[operator]
    head: torch.Tensor = model.get_output_embeddings().weight  # type: ignore[operator]
    with torch.no_grad():
        embed[:, 0] = 100.0
        head[:, 0] = 0.0
        hidden = 64**0.5  # the constant dimension after RMSNorm (the rest is small against it)
        rest = head.shape[0] - 1
        head[end, 0] = math.log(odds * rest / (1 - odds)) / hidden


# The tiny presets every engine understands: name -> (model type, RoPE scaling, config overrides)
PRESETS: dict[str, tuple[str, dict[str, Any] | None, dict[str, Any]]] = {
    "tiny-mla": ("deepseek_v2", None, {}),
    "tiny-mla-v3": ("deepseek_v3", YARN, {"rope_interleave": True}),
    "tiny-gqa": ("llama", None, {}),
    # a tiny model with a long context for the real agent clients (Codex ~22k, Claude Code ~46k
    # tokens of the tiny tokenizer), whose sampled replies end within a few tokens (see _end_often)
    "tiny-gqa-long": ("llama", None, {"max_position_embeddings": 131072, "rope_theta": 1e6, "leyline_end_odds": 0.5}),
    # sliding-window shapes (layer kinds from _layer_kinds): Gemma 3 (5 local : 1 global, two RoPE
    # bases) and gpt-oss (alternating local and global layers, attention sinks, YaRN)
    "tiny-gemma3": ("gemma3_text", None, {}),
    "tiny-gptoss": ("gpt_oss", None, {}),
}
# (local, global) layers in each repeating group of a windowed preset; the last layer is global
_LOCAL_GLOBAL = {"gemma3_text": (5, 1), "gpt_oss": (1, 1)}


def preset_config(name: str, layers: int = 2, **overrides: Any) -> Any:
    """The transformers config of preset ``name`` (``layers`` decoder layers)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}")
    model_type, rope, extra = PRESETS[name]
    if model_type in _LOCAL_GLOBAL and "layer_types" not in overrides:
        extra = {**extra, "layer_types": _layer_kinds(layers, *_LOCAL_GLOBAL[model_type])}
    return tiny_config(model_type, layers=layers, rope=rope, **{**extra, **overrides})


def _layer_kinds(layers: int, local: int, every: int) -> list[str]:
    """``local`` sliding-window layers then ``every`` global ones, repeated; the last layer global
    (so that a two-layer preset holds both kinds)."""
    period = local + every
    kinds = ["sliding_attention" if i % period < local else "full_attention" for i in range(layers)]
    kinds[-1] = "full_attention"
    return kinds
