"""RoPE shift specification: what a δ-rotation of a cached key must do for one model.

A :class:`RopeSpec` answers, for the rows of a slot pool laid out like the model's cache:

* **which slice rotates** — ``rotary_offset``/``rotary_dim`` within each cached head row.
  MLA (DeepSeek) pool rows are ``[latent (kv_lora_rank) | k_pe (qk_rope_head_dim)]``: only k_pe
  rotates. GQA/MHA rows are one head: the first ``head_dim * partial_rotary_factor`` dims rotate.
* **the cached pair layout** — ``interleaved`` pairs ``(2i, 2i+1)`` or ``half_split`` pairs
  ``(i, i + d/2)``. It depends on the implementation: transformers' DeepSeek-V2 caches k_pe
  interleaved; its DeepSeek-V3 caches k_pe half-split whether ``rope_interleave`` is on (it
  de-interleaves while rotating) or off; Llama/Qwen/Mistral/GPT-NeoX are half-split.
* **the inverse frequencies** — taken from the model's own rotary-embedding module built from the
  config, so ``default``, ``linear``, ``yarn`` and ``llama3`` scaling match the model bit for bit.
  YaRN's ``attention_scaling`` (mscale) is already inside every cached key: the shift is a *unit*
  rotation and never applies it again.
* **whether a shift is valid at all** — ``dynamic`` NTK and ``longrope`` frequencies depend on the
  sequence length and are not closed under shifting; absolute position embeddings cannot be
  shifted; ALiBi/NoPE keys carry no position (a free shift, ``rotary_dim == 0``). Unknown model
  types are reported unshiftable rather than guessed.
"""

from __future__ import annotations

import importlib
from enum import Enum
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

__all__ = ["PairLayout", "RopeSpec", "rope_spec_from_config"]


class PairLayout(str, Enum):
    """How the two elements of each rotary pair sit in the cached row."""

    INTERLEAVED = "interleaved"  # (2i, 2i+1)
    HALF_SPLIT = "half_split"  # (i, i + d/2), "neox" / rotate_half


class RopeSpec(BaseModel):
    """Everything a δ-rotation needs to know about one model's cached keys."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    model_type: str
    shiftable: bool
    reason: str | None = None
    rotary_offset: int = 0
    rotary_dim: int = 0
    layout: PairLayout = PairLayout.HALF_SPLIT
    inv_freq: tuple[float, ...] = ()
    rope_type: str = "none"
    attention_scaling: float = 1.0

    def inv_freq_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The fp32 inverse frequencies, ``rotary_dim // 2`` of them."""
        return torch.tensor(self.inv_freq, dtype=torch.float32, device=device)

    @classmethod
    def plain(cls, rotary_offset: int, rotary_dim: int, layout: PairLayout, base: float = 10000.0) -> RopeSpec:
        """A shiftable spec with unscaled frequencies (fp32, as transformers' ``default`` RoPE).

        For kernels, benchmarks and tests that need a rotation without a model.
        """
        inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        return cls(
            model_type="plain",
            shiftable=True,
            rotary_offset=rotary_offset,
            rotary_dim=rotary_dim,
            layout=layout,
            inv_freq=tuple(inv.tolist()),
            rope_type="default",
        )

    def with_layout(self, layout: PairLayout) -> RopeSpec:
        """A copy with another pair layout (tests use it to prove a wrong layout is caught)."""
        return self.model_copy(update={"layout": layout})


# model_type -> (module, rotary class, cached layout or None for "ask the config", kind)
_ROPE_FAMILIES: dict[str, tuple[str, str, PairLayout | None, str]] = {
    "deepseek_v2": ("deepseek_v2", "DeepseekV2RotaryEmbedding", PairLayout.INTERLEAVED, "mla"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3RotaryEmbedding", PairLayout.HALF_SPLIT, "mla"),
    "llama": ("llama", "LlamaRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "mistral": ("mistral", "MistralRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "qwen2": ("qwen2", "Qwen2RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "qwen3": ("qwen3", "Qwen3RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "gpt_neox": ("gpt_neox", "GPTNeoXRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "mixtral": ("mixtral", "MixtralRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "olmo": ("olmo", "OlmoRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "olmo2": ("olmo2", "Olmo2RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "granite": ("granite", "GraniteRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "phi3": ("phi3", "Phi3RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "stablelm": ("stablelm", "StableLmRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "gemma": ("gemma", "GemmaRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
}
_POSITION_FREE = {"bloom": "ALiBi", "mpt": "ALiBi"}
_ABSOLUTE = {"gpt2", "opt", "gpt_bigcode", "bert", "roberta", "gpt_neo", "biogpt", "xglm"}
_SHIFTABLE_ROPE_TYPES = {"default", "linear", "yarn", "llama3"}
_UNSHIFTABLE_ROPE_TYPES = {
    "dynamic": "dynamic NTK frequencies depend on the sequence length",
    "longrope": "longrope switches frequencies at its original context length",
}


def _rope_parameters(config: Any) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def _unshiftable(model_type: str, reason: str) -> RopeSpec:
    return RopeSpec(model_type=model_type, shiftable=False, reason=reason)


def rope_spec_from_config(config: Any) -> RopeSpec:
    """Build the :class:`RopeSpec` of a transformers config (``config.model_type`` picks the family)."""
    model_type = getattr(config, "model_type", "") or ""
    if model_type in _POSITION_FREE:
        if getattr(config, "alibi", True) is False:
            return _unshiftable(model_type, "absolute position embeddings cannot be shifted")
        return RopeSpec(model_type=model_type, shiftable=True, rope_type=_POSITION_FREE[model_type].lower())
    if model_type in _ABSOLUTE:
        return _unshiftable(model_type, "absolute position embeddings cannot be shifted")
    if model_type not in _ROPE_FAMILIES:
        return _unshiftable(model_type, f"unknown model type {model_type!r}: Leyline does not guess a RoPE layout")

    params = _rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in _UNSHIFTABLE_ROPE_TYPES:
        return _unshiftable(model_type, f"rope_type={rope_type!r}: {_UNSHIFTABLE_ROPE_TYPES[rope_type]}")
    if rope_type not in _SHIFTABLE_ROPE_TYPES:
        return _unshiftable(model_type, f"rope_type={rope_type!r} is not supported")

    module_name, class_name, layout, kind = _ROPE_FAMILIES[model_type]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    rotary = getattr(module, class_name)(config=config)
    inv_freq = rotary.inv_freq.detach().to(torch.float32).cpu()
    rotary_dim = 2 * inv_freq.numel()
    if kind == "mla":
        offset = int(config.kv_lora_rank)
        if rotary_dim != int(config.qk_rope_head_dim):
            return _unshiftable(model_type, "rotary frequencies do not match qk_rope_head_dim")
    else:
        offset = 0
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if rotary_dim > head_dim:
            return _unshiftable(model_type, "rotary dimension exceeds the head dimension")
    return RopeSpec(
        model_type=model_type,
        shiftable=True,
        rotary_offset=offset,
        rotary_dim=rotary_dim,
        layout=layout or PairLayout.HALF_SPLIT,
        inv_freq=tuple(float(x) for x in inv_freq.tolist()),
        rope_type=rope_type,
        attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
    )
