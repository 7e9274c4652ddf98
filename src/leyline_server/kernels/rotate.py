"""Fused gather–copy–rotate over all layers of a slot pool (torch reference + dispatcher).

Pool layout (one tensor for all layers, rows are what the model caches per token and head)::

    keys   [L, S, H, D]   MLA: H = 1, D = kv_lora_rank + qk_rope_head_dim  ([latent | k_pe])
                          GQA: H = kv heads, D = head_dim
    values [L, S, Hv, Dv] GQA only; copied, never rotated

For every layer and every i: ``keys[l, dst[i]] = rotate(keys[l, src[i]], new_pos[i] - old_pos[i])``
(with layer ``l``'s own frequencies where the model's layers differ, :meth:`RopeSpec.layer_runs`)
where only ``D[rotary_offset : rotary_offset + rotary_dim]`` rotates (pairs per ``spec.layout``)
and the rest is copied. The angle of pair j is ``fp32(new·θ_j) − fp32(old·θ_j)`` — the phases
the model itself computed — subtracted exactly (fp64) and applied as a *unit* rotation in fp32,
then stored in the pool's dtype. ``src == dst`` (elementwise) rotates in place; any other
overlap between the two slot sets is refused (it would read rows already written).
"""

from __future__ import annotations

from typing import Literal

import torch

from leyline_server.kernels.phases import CHUNK, rotate_slice_, shift_cos_sin, triton_usable
from leyline_server.rope import RopeSpec

__all__ = ["rotate_copy", "rotate_copy_torch", "shift_cos_sin", "validate_pool", "Backend"]

Backend = Literal["auto", "torch", "cpu", "triton"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rotate_copy_torch(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None = None,
) -> None:
    """Plain-torch implementation (CPU default and the test oracle); see the module docstring.

    Works layer by layer (each with its own frequencies, :meth:`RopeSpec.for_layer`) in chunks of
    tokens: gather (a copy, so ``src == dst`` is safe), rotate the slice in fp32, scatter.
    """
    width = spec.rotary_dim
    lo, hi = spec.rotary_offset, spec.rotary_offset + width
    n = src_slots.numel()
    if width:
        cos, sin = shift_cos_sin(old_pos, new_pos, spec)
    for layer in range(keys.shape[0]):
        if width and spec.layers:  # the layer's own frequencies where layers differ
            cos, sin = shift_cos_sin(old_pos, new_pos, spec.for_layer(layer))
        pool = keys[layer]
        for a in range(0, n, CHUNK):
            src, dst = src_slots[a : a + CHUNK], dst_slots[a : a + CHUNK]
            rows = pool.index_select(0, src)
            if width:
                rotate_slice_(rows, lo, hi, cos[a : a + CHUNK], sin[a : a + CHUNK], spec.layout)
            pool.index_copy_(0, dst, rows)
        if values is not None:
            values[layer].index_copy_(0, dst_slots, values[layer].index_select(0, src_slots))


def validate_pool(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None,
) -> None:
    """``ValueError`` unless the arguments fit :func:`rotate_copy` (shapes, dtypes, slots, overlap)."""
    if not spec.shiftable:
        raise ValueError(f"RoPE of {spec.model_type!r} is not shiftable: {spec.reason}")
    if keys.dim() != 4:
        raise ValueError(f"keys must be [layers, slots, heads, dim], got shape {tuple(keys.shape)}")
    if keys.dtype not in _DTYPES:
        raise ValueError(f"keys dtype must be one of {_DTYPES}, got {keys.dtype}")
    n = src_slots.numel()
    for name, t in (
        ("src_slots", src_slots),
        ("dst_slots", dst_slots),
        ("old_pos", old_pos),
        ("new_pos", new_pos),
    ):
        if t.dim() != 1 or t.numel() != n:
            raise ValueError(f"{name} must be 1-D with {n} entries, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
        if t.device != keys.device:
            raise ValueError(f"{name} is on {t.device}, keys on {keys.device}")
    if spec.rotary_dim % 2 or spec.rotary_offset + spec.rotary_dim > keys.shape[-1]:
        raise ValueError(
            f"rotary slice [{spec.rotary_offset}, {spec.rotary_offset + spec.rotary_dim}) "
            f"does not fit rows of {keys.shape[-1]}"
        )
    if len(spec.inv_freq) != spec.rotary_dim // 2:
        raise ValueError("spec.inv_freq must hold rotary_dim // 2 frequencies")
    if n:
        slots = keys.shape[1]
        lo = int(torch.minimum(src_slots.min(), dst_slots.min()))
        hi = int(torch.maximum(src_slots.max(), dst_slots.max()))
        if lo < 0 or hi >= slots:
            raise ValueError(f"slot indices must lie in [0, {slots}), got [{lo}, {hi}]")
        if not torch.equal(src_slots, dst_slots):
            if torch.unique(dst_slots).numel() != n:
                raise ValueError("dst_slots must not repeat a slot")
            if torch.isin(dst_slots, src_slots).any():
                raise ValueError("src_slots and dst_slots must be identical (in place) or disjoint")
    if values is not None and (values.dim() != 4 or values.shape[:2] != keys.shape[:2]):
        raise ValueError("values must be [layers, slots, heads, dim] with the keys' layers and slots")


def rotate_copy(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> None:
    """Gather–copy–rotate ``src_slots`` into ``dst_slots`` over every layer of the pool.

    ``backend="auto"`` uses the Triton kernel for CUDA tensors and the CPU fast path
    (:mod:`~leyline_server.kernels.rotate_cpu`: slices for slot runs, one complex multiplication
    for interleaved pairs) otherwise; ``"torch"`` is the plain reference (the tests' oracle);
    ``"triton"`` on CPU needs ``TRITON_INTERPRET=1`` set before the kernel module is first imported.
    Raises ``ValueError`` on bad shapes, dtypes, slot indices, or an unshiftable spec.
    """
    validate_pool(keys, src_slots, dst_slots, old_pos, new_pos, spec, values)
    runs = spec.layer_runs(keys.shape[0])  # one run unless layers differ; ValueError if it misfits
    if src_slots.numel() == 0:
        return
    for start, stop, layer_spec in runs:
        part = values[start:stop] if values is not None else None
        _rotate_alike(keys[start:stop], src_slots, dst_slots, old_pos, new_pos, layer_spec, part, backend)


def _rotate_alike(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None,
    backend: Backend,
) -> None:
    """:func:`rotate_copy` over layers that share one rotation (``spec`` without per-layer parts)."""
    use_triton = backend == "triton" or (backend == "auto" and keys.device.type == "cuda")
    if use_triton:
        if not triton_usable(keys.device):
            raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1 (set before import)")
        from leyline_server.kernels.rotate_triton import rotate_copy_triton

        rotate_copy_triton(keys, src_slots, dst_slots, old_pos, new_pos, spec, values)
    elif backend == "torch" or keys.device.type != "cpu":
        rotate_copy_torch(keys, src_slots, dst_slots, old_pos, new_pos, spec, values)
    else:
        from leyline_server.kernels.rotate_cpu import rotate_copy_cpu

        rotate_copy_cpu(keys, src_slots, dst_slots, old_pos, new_pos, spec, values)
