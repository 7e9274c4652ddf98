"""Gather–copy–rotate over per-layer buffers (SGLang keeps one tensor per layer, not one pool).

Same contract and math as :func:`leyline_server.kernels.rotate_copy`, for pools stored as a list of
``[S, H, D]`` tensors (SGLang's MHA ``k_buffer[l]`` / ``v_buffer[l]``, MLA ``kv_buffer[l]`` with rows
``[latent | k_pe]``): for every layer and every i, ``keys[l][dst[i]] = rotate(keys[l][src[i]],
new_pos[i] - old_pos[i])``, only ``D[rotary_offset : rotary_offset + rotary_dim]`` rotating. The
angle is the fp64 difference of the model's own fp32 phases (:func:`shift_cos_sin`, computed once
for all layers) applied as a unit rotation in fp32 — never the YaRN mscale. Values are copied.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from leyline_server.kernels.phases import CHUNK, rotate_slice_, shift_cos_sin, triton_usable
from leyline_server.kernels.rotate import Backend, validate_pool
from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["rotate_copy_layers"]


def _check_layers(name: str, buffers: Sequence[torch.Tensor]) -> None:
    if not buffers:
        raise ValueError(f"{name} must hold at least one layer")
    first = buffers[0]
    for i, buf in enumerate(buffers):
        if buf.dim() != 3:
            raise ValueError(f"{name}[{i}] must be [slots, heads, dim], got shape {tuple(buf.shape)}")
        if buf.shape != first.shape or buf.dtype != first.dtype or buf.device != first.device:
            raise ValueError(f"{name}[{i}] differs from {name}[0] in shape, dtype or device")


def _torch_layer(
    pool: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    spec: RopeSpec,
) -> None:
    lo, hi = spec.rotary_offset, spec.rotary_offset + spec.rotary_dim
    for a in range(0, src.numel(), CHUNK):
        rows = pool.index_select(0, src[a : a + CHUNK])  # a copy: src == dst is safe
        if cos is not None and sin is not None:
            rotate_slice_(rows, lo, hi, cos[a : a + CHUNK], sin[a : a + CHUNK], spec.layout)
        pool.index_copy_(0, dst[a : a + CHUNK], rows)


def _triton_layers(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor] | None,
    src: torch.Tensor,
    dst: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    spec: RopeSpec,
) -> None:
    from leyline_server.kernels.rotate_triton import launch

    src, dst = src.contiguous(), dst.contiguous()
    width = spec.rotary_dim
    if cos is None or sin is None:
        cos = sin = torch.empty(1, dtype=torch.float32, device=src.device)
    interleaved = spec.layout is PairLayout.INTERLEAVED
    for buf in keys:
        launch(buf.unsqueeze(0), src, dst, cos, sin, buf.shape[-1], spec.rotary_offset, width, interleaved)
    for buf in values or ():
        launch(buf.unsqueeze(0), src, dst, cos, sin, buf.shape[-1], 0, 0, False)


def rotate_copy_layers(
    keys: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: Sequence[torch.Tensor] | None = None,
    backend: Backend = "auto",
) -> None:
    """Gather–copy–rotate ``src_slots`` into ``dst_slots`` in every layer buffer of ``keys``.

    ``keys[l]`` is ``[S, H, D]`` (all layers alike), ``values[l]`` ``[S, Hv, Dv]`` (copied, never
    rotated). ``backend="auto"`` runs the Triton kernel (one launch per layer) on CUDA and torch
    otherwise; the slot and position checks are :func:`rotate_copy`'s, done once. Raises
    ``ValueError`` on bad shapes, dtypes, slot indices or an unshiftable spec.
    """
    _check_layers("keys", keys)
    if values is not None:
        _check_layers("values", values)
    validate_pool(
        keys[0].unsqueeze(0),
        src_slots,
        dst_slots,
        old_pos,
        new_pos,
        spec,
        values[0].unsqueeze(0) if values is not None else None,
    )
    if values is not None and len(values) != len(keys):
        raise ValueError(f"{len(values)} value layers for {len(keys)} key layers")
    runs = spec.layer_runs(len(keys))  # one run unless layers differ; ValueError if it misfits
    if src_slots.numel() == 0:
        return
    for start, stop, layer_spec in runs:
        part = values[start:stop] if values is not None else None
        _rotate_alike(keys[start:stop], src_slots, dst_slots, old_pos, new_pos, layer_spec, part, backend)


def _rotate_alike(
    keys: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: Sequence[torch.Tensor] | None,
    backend: Backend,
) -> None:
    """:func:`rotate_copy_layers` over layers that share one rotation."""
    cos = sin = None
    if spec.rotary_dim:
        cos, sin = (t.contiguous() for t in shift_cos_sin(old_pos, new_pos, spec))
    use_triton = backend == "triton" or (backend == "auto" and keys[0].device.type == "cuda")
    if use_triton:
        if not triton_usable(keys[0].device):
            raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1 (set before import)")
        _triton_layers(keys, values, src_slots, dst_slots, cos, sin, spec)
        return
    for buf in keys:
        _torch_layer(buf, src_slots, dst_slots, cos, sin, spec)
    for buf in values or ():
        _torch_layer(buf, src_slots, dst_slots, None, None, spec)
