"""RoPE of an SGLang model, read from its own rotary module: the shift spec and the canary's reference.

SGLang's layout differs from transformers' for some families (DeepSeek k_pe is interleaved,
``is_neox_style = not rope_interleave``), so the spec is built from the module SGLang applies to
K — ``model.model.layers[0].self_attn.rotary_emb`` — never from the transformers config:

* pair layout: ``is_neox_style`` (half-split) or GPT-J (interleaved);
* inverse frequencies: the module's own ``_compute_inv_freq`` (YaRN's ramp, llama3's bands),
  never its ``cos_sin_cache``, which has the YaRN mscale folded in;
* only rotary classes whose frequencies do not depend on the sequence are shiftable (plain,
  linear with one factor, llama3, YaRN, DeepSeek-YaRN); dynamic NTK, mrope, longrope, dual-chunk
  and the rest are refused by name (``rope_unsupported``).

The canary's reference (:func:`reference_rotation`) asks the same module what a key computed at
``old`` becomes at ``new``: it applies ``forward_native`` (the module's plain-torch path) to basis
vectors to read its rotation matrices, so it shares no code with Leyline's spec or kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["find_rotary", "rope_spec_from_rotary", "reference_rotation", "SHIFTABLE_ROTARY"]

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


def _matrices(rotary: Any, positions: torch.Tensor) -> torch.Tensor:
    """``[N, rot, rot]`` fp64: column j of matrix i is the module's output for basis vector j at position i."""
    rot, head = int(rotary.rotary_dim), int(rotary.head_size)
    n = positions.numel()
    basis = torch.zeros(n * rot, 1, head, dtype=torch.float32, device=positions.device)
    eye = torch.eye(rot, dtype=torch.float32, device=positions.device)
    basis[:, 0, :rot] = eye.repeat(n, 1)
    pos = positions.repeat_interleave(rot)
    _, out = rotary.forward_native(pos, basis.clone(), basis.clone())
    cols = out.reshape(n, rot, -1)[..., :rot].to(torch.float64)  # [N, j, rot] = M e_j
    return cols.transpose(1, 2)


@torch.no_grad()
def reference_rotation(
    rotary: Any, rows: torch.Tensor, old: torch.Tensor, new: torch.Tensor, offset: int
) -> torch.Tensor:
    """What the model's own rotary module makes of ``rows`` (cached at ``old``) moved to ``new``.

    ``rows`` ``[N, H, D]``: the rotary slice ``[offset, offset + rotary_dim)`` of every head is
    un-rotated with the module's matrix at ``old`` and rotated with the one at ``new`` (any YaRN
    mscale cancels); the rest of the row is unchanged. Returns fp64 rows.
    """
    rot = int(rotary.rotary_dim)
    out = rows.to(torch.float64).clone()
    m_old, m_new = _matrices(rotary, old), _matrices(rotary, new)
    x = out[..., offset : offset + rot]  # [N, H, rot]
    raw = torch.linalg.solve(m_old[:, None], x.unsqueeze(-1))  # [N, H, rot, 1]
    out[..., offset : offset + rot] = (m_new[:, None] @ raw).squeeze(-1)
    return out
