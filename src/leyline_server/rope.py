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
* **each layer's own rotation and window** — models that mix sliding-window (local) and global
  layers may give each kind its own RoPE (Gemma 3: local base 10k, global 1M). ``layers`` then
  holds one :class:`LayerRope` per decoder layer (its frequencies, its window, whether it has
  attention sinks) and a δ-rotation rotates each layer with its own frequencies
  (:meth:`RopeSpec.layer_runs`). A window changes nothing in the rotation: the engines keep every
  row of a windowed layer while it may be spliced, and attention applies the window by position.
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
from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["LayerRope", "PairLayout", "RopeSpec", "rope_spec_from_config"]


class PairLayout(str, Enum):
    """How the two elements of each rotary pair sit in the cached row."""

    INTERLEAVED = "interleaved"  # (2i, 2i+1)
    HALF_SPLIT = "half_split"  # (i, i + d/2), "neox" / rotate_half


class LayerRope(BaseModel):
    """One decoder layer's attention as a splice sees it: its rotation and its window.

    ``window``: the layer attends over the last ``window`` positions only (sliding-window, local
    attention); ``None``: over every position (global). ``sinks``: the layer has learned attention
    sinks (gpt-oss), logits outside the cache that a splice never touches.
    """

    model_config = ConfigDict(frozen=True)

    inv_freq: tuple[float, ...]
    rope_type: str = "default"
    attention_scaling: float = 1.0
    window: int | None = None
    sinks: bool = False


class RopeSpec(BaseModel):
    """Everything a δ-rotation needs to know about one model's cached keys.

    ``inv_freq``/``rope_type``/``attention_scaling`` are layer 0's; ``layers``, when the model
    declares per-layer attention kinds, holds every layer's own (:meth:`for_layer`).
    """

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
    layers: tuple[LayerRope, ...] = ()

    @model_validator(mode="after")
    def _layers_alike_wide(self) -> RopeSpec:
        if any(len(layer.inv_freq) != len(self.inv_freq) for layer in self.layers):
            raise ValueError("every layer's inverse frequencies must number rotary_dim // 2, as layer 0's do")
        return self

    def for_layer(self, layer: int) -> RopeSpec:
        """The spec of decoder layer ``layer`` alone: its own frequencies, no per-layer list."""
        if not self.layers:
            return self
        own = self.layers[layer]
        return self.model_copy(
            update={
                "inv_freq": own.inv_freq,
                "rope_type": own.rope_type,
                "attention_scaling": own.attention_scaling,
                "layers": (),
            }
        )

    def layer_runs(self, n_layers: int) -> list[tuple[int, int, RopeSpec]]:
        """Runs ``(start, stop, spec)`` of consecutive layers that rotate alike, covering ``n_layers``.

        One run for a model whose layers share their frequencies; ``ValueError`` when ``layers``
        does not describe ``n_layers`` layers.
        """
        if not self.layers:
            return [(0, n_layers, self)]
        if len(self.layers) != n_layers:
            raise ValueError(f"the RoPE spec describes {len(self.layers)} layers, the pool holds {n_layers}")
        runs: list[tuple[int, int, RopeSpec]] = []
        for i, layer in enumerate(self.layers):
            if runs and self.layers[runs[-1][0]].inv_freq == layer.inv_freq:
                runs[-1] = (runs[-1][0], i + 1, runs[-1][2])
            else:
                runs.append((i, i + 1, self.for_layer(i)))
        return runs

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (``None``: global); empty when the model declares no kinds."""
        return tuple(layer.window for layer in self.layers)

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
    "gemma2": ("gemma2", "Gemma2RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
    "gpt_oss": ("gpt_oss", "GptOssRotaryEmbedding", PairLayout.HALF_SPLIT, "gqa"),
}
_SINKS = {"gpt_oss"}  # families whose attention layers carry learned sinks
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

    rope_types = _rope_types(config)
    for rope_type in rope_types.values():
        if rope_type in _UNSHIFTABLE_ROPE_TYPES:
            return _unshiftable(model_type, f"rope_type={rope_type!r}: {_UNSHIFTABLE_ROPE_TYPES[rope_type]}")
        if rope_type not in _SHIFTABLE_ROPE_TYPES:
            return _unshiftable(model_type, f"rope_type={rope_type!r} is not supported")

    module_name, class_name, layout, kind = _ROPE_FAMILIES[model_type]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    rotary = getattr(module, class_name)(config=config)
    layers = _layer_ropes(config, rotary, rope_types, sinks=model_type in _SINKS)
    first = layers[0] if layers else None
    inv_freq = torch.tensor(first.inv_freq) if first else rotary.inv_freq.detach().to(torch.float32).cpu()
    rotary_dim = 2 * inv_freq.numel()
    if any(len(layer.inv_freq) != inv_freq.numel() for layer in layers):
        return _unshiftable(model_type, "layers rotate different numbers of dimensions")
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
        rope_type=first.rope_type if first else rope_types[""],
        attention_scaling=first.attention_scaling if first else float(getattr(rotary, "attention_scaling", 1.0)),
        layers=() if _alike(layers) else layers,
    )


def _alike(layers: tuple[LayerRope, ...]) -> bool:
    """Whether every layer rotates alike and attends globally: nothing per layer worth keeping."""
    return len(set(layers)) <= 1 and all(layer.window is None and not layer.sinks for layer in layers)


def _rope_types(config: Any) -> dict[str, str]:
    """The RoPE type of each attention kind (``""`` when one set of parameters serves every layer)."""
    params = _rope_parameters(config)
    kinds = set(getattr(config, "layer_types", None) or ())
    if params and kinds and set(params) <= kinds:  # per kind (Gemma 3: sliding_attention, full_attention)
        return {k: (v or {}).get("rope_type", (v or {}).get("type", "default")) for k, v in params.items()}
    return {"": params.get("rope_type", params.get("type", "default"))}


def _layer_ropes(config: Any, rotary: Any, rope_types: dict[str, str], sinks: bool) -> tuple[LayerRope, ...]:
    """One :class:`LayerRope` per decoder layer when the config declares ``layer_types``, else ``()``.

    A rotary module with per-kind frequencies holds them as ``{kind}_inv_freq`` (transformers'
    Gemma 3); otherwise every layer shares ``inv_freq``.
    """
    kinds = getattr(config, "layer_types", None)
    if not kinds:
        return ()
    window = getattr(config, "sliding_window", None)
    out = []
    for kind in kinds:
        inv = getattr(rotary, f"{kind}_inv_freq", None)
        inv = rotary.inv_freq if inv is None else inv
        scaling = getattr(rotary, f"{kind}_attention_scaling", None)
        out.append(
            LayerRope(
                inv_freq=tuple(float(x) for x in inv.detach().to(torch.float32).cpu().tolist()),
                rope_type=rope_types.get(kind, rope_types.get("", "default")),
                attention_scaling=float(scaling if scaling is not None else getattr(rotary, "attention_scaling", 1.0)),
                window=int(window) if kind == "sliding_attention" and window else None,
                sinks=sinks,
            )
        )
    return tuple(out)
