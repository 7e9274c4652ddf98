"""RoPE of an SGLang model, read from its own rotary module: the shift spec.

SGLang's layout differs from transformers' for some families (DeepSeek k_pe is interleaved,
``is_neox_style = not rope_interleave``), so the spec is built from the module SGLang applies to
K — ``model.model.layers[0].self_attn.rotary_emb`` — never from the transformers config:

* pair layout: ``is_neox_style`` (half-split) or GPT-J (interleaved);
* inverse frequencies: the module's own ``_compute_inv_freq`` (YaRN's ramp, llama3's bands),
  never its ``cos_sin_cache``, which has the YaRN mscale folded in;
* only rotary classes whose frequencies do not depend on the sequence are shiftable (plain,
  linear with one factor, llama3, YaRN, DeepSeek-YaRN); dynamic NTK, mrope, longrope, dual-chunk
  and the rest are refused by name (``rope_unsupported``).

The canary does not trust this spec: it compares rotated rows with the model's own layer-0 keys
(:mod:`.layer0`), computed by SGLang's modules, so a wrong layout or frequency shows there.
"""

from __future__ import annotations

from typing import Any

import torch

from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["find_rotary", "first_differing_layer", "rope_spec_from_rotary", "SHIFTABLE_ROTARY"]

# SGLang rotary class -> how its inverse frequencies are computed
SHIFTABLE_ROTARY = {
    "RotaryEmbedding": "base",
    "Llama3RotaryEmbedding": "base",
    "LinearScalingRotaryEmbedding": "linear",
    "YaRNScalingRotaryEmbedding": "scaling",
    "DeepseekScalingRotaryEmbedding": "scaling",
}


def find_rotary(model: Any) -> Any | None:
    """The rotary module layer 0 applies to its keys (``None`` if the model has none there)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers:
        return None
    attn = getattr(layers[0], "self_attn", None)
    return getattr(attn, "rotary_emb", None)


def _signature(rotary: Any | None) -> tuple[Any, ...] | None:
    """What decides a rotary module's rotation: class, dims, layout, base, scaling."""
    if rotary is None:
        return None
    names = ("rotary_dim", "is_neox_style", "base", "scaling_factor", "scaling_factors")
    return (type(rotary).__name__, *(repr(getattr(rotary, n, None)) for n in names))


def first_differing_layer(model: Any) -> int | None:
    """The first layer whose rotary module rotates unlike layer 0's (``None``: all alike).

    The spec is read from layer 0 alone; a model whose layers differ (Gemma 3's local layers use
    base 10k, its global ones 1M) would have its other layers rotated wrongly, and the canary,
    which checks layer 0, would not see it.
    """
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    first = _signature(find_rotary(model))
    for i, layer in enumerate(layers):
        if _signature(getattr(getattr(layer, "self_attn", None), "rotary_emb", None)) != first:
            return i
    return None


def _inv_freq(rotary: Any, kind: str) -> torch.Tensor | str:
    if kind == "base":
        return rotary._compute_inv_freq(rotary.base)
    if kind == "scaling":
        return rotary._compute_inv_freq(rotary.scaling_factor)
    factors = list(getattr(rotary, "scaling_factors", []))
    if len(factors) != 1:
        return f"linear scaling with {len(factors)} factors (LoRA caches) is not supported"
    # SGLang's phase is fp32(pos / s) * inv_freq: equal to pos * (inv_freq / s) within one ulp
    return rotary._compute_inv_freq(rotary.base) / float(factors[0])


def rope_spec_from_rotary(rotary: Any | None, rotary_offset: int, model_type: str) -> RopeSpec:
    """The :class:`RopeSpec` of SGLang's rotary module; unshiftable (with the reason) when unsupported.

    ``rotary_offset``: where the rotary slice starts in a cached row (MLA: ``kv_lora_rank``, the
    latent comes first; MHA: 0).
    """
    if rotary is None:
        return RopeSpec(model_type=model_type, shiftable=False, reason="no rotary embedding found on layer 0")
    name = type(rotary).__name__
    kind = SHIFTABLE_ROTARY.get(name)
    if kind is None:
        reason = f"SGLang rotary {name} is not shiftable (frequencies depend on the sequence or positions are not 1-D)"
        return RopeSpec(model_type=model_type, shiftable=False, reason=reason)
    inv = _inv_freq(rotary, kind)
    if isinstance(inv, str):
        return RopeSpec(model_type=model_type, shiftable=False, reason=inv)
    inv = inv.detach().to(device="cpu", dtype=torch.float32)
    if 2 * inv.numel() != int(rotary.rotary_dim):
        return RopeSpec(model_type=model_type, shiftable=False, reason="rotary frequencies do not match rotary_dim")
    return RopeSpec(
        model_type=model_type,
        shiftable=True,
        rotary_offset=rotary_offset,
        rotary_dim=int(rotary.rotary_dim),
        layout=PairLayout.HALF_SPLIT if rotary.is_neox_style else PairLayout.INTERLEAVED,
        inv_freq=tuple(float(x) for x in inv.tolist()),
        rope_type=f"sglang:{name}",
        attention_scaling=float(getattr(rotary, "mscale", 1.0)),
    )
