"""Triton gather–copy–rotate kernel (CUDA; CPU under ``TRITON_INTERPRET=1`` for tests).

One program handles ``BLOCK_N`` tokens of one layer: it loads each source row whole (all heads),
loads the pair partner of every rotary element, rotates with the per-token cos/sin table from
:func:`shift_cos_sin` (so the angle is exactly the torch path's), and stores the destination row
in the pool dtype. Rows are read before they are written within one program and no two programs
share a row, so ``src == dst`` is safe. Values (GQA) go through the same kernel with no rotary
slice. Call through :func:`leyline_server.kernels.rotate_copy`, which validates the arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from leyline_server.kernels.phases import shift_cos_sin
from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["rotate_copy_triton"]


@triton.jit
def _gather_rotate_kernel(
    src_ptr,
    dst_ptr,
    src_slots_ptr,
    dst_slots_ptr,
    cos_ptr,
    sin_ptr,
    n_tokens,
    layer_stride,
    ROW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    OFFSET: tl.constexpr,
    WIDTH: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
):
    layer = tl.program_id(0).to(tl.int64)
    tok = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tok_mask = tok < n_tokens
    src = tl.load(src_slots_ptr + tok, mask=tok_mask, other=0).to(tl.int64)
    dst = tl.load(dst_slots_ptr + tok, mask=tok_mask, other=0).to(tl.int64)
    col = tl.arange(0, BLOCK_ROW)
    mask = tok_mask[:, None] & (col < ROW)[None, :]
    base = layer * layer_stride
    src_row = src_ptr + base + src[:, None] * ROW
    x = tl.load(src_row + col[None, :], mask=mask, other=0.0).to(tl.float32)
    if WIDTH > 0:
        j = col % HEAD_DIM - OFFSET
        is_rot = (j >= 0) & (j < WIDTH) & (col < ROW)
        jj = tl.where(is_rot, j, 0)
        if INTERLEAVED:
            pair = jj // 2
            first = (jj % 2) == 0
            partner = tl.where(first, col + 1, col - 1)
        else:
            pair = jj % (WIDTH // 2)
            first = jj < (WIDTH // 2)
            partner = tl.where(first, col + WIDTH // 2, col - WIDTH // 2)
        rot_mask = mask & is_rot[None, :]
        xp = tl.load(src_row + partner[None, :], mask=rot_mask, other=0.0).to(tl.float32)
        table = tok[:, None] * (WIDTH // 2) + pair[None, :]
        c = tl.load(cos_ptr + table, mask=rot_mask, other=1.0)
        s = tl.load(sin_ptr + table, mask=rot_mask, other=0.0)
        sign = tl.where(first, -1.0, 1.0)
        x = tl.where(rot_mask, x * c + sign[None, :] * xp * s, x)
    tl.store(
        dst_ptr + base + dst[:, None] * ROW + col[None, :],
        x.to(dst_ptr.dtype.element_ty),
        mask=mask,
    )


def launch(
    pool: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    offset: int,
    width: int,
    interleaved: bool,
) -> None:
    """Launch the kernel over every layer of ``pool`` ``[L, S, H, D]`` (cos/sin precomputed)."""
    assert pool.is_contiguous(), "the pool must be contiguous"
    layers, slots = pool.shape[0], pool.shape[1]
    row = pool[0, 0].numel()
    n = src.numel()
    block_row = triton.next_power_of_2(row)
    # The interpreter runs programs one after another: large blocks keep tests fast there.
    interpret = pool.device.type != "cuda"
    block_n = triton.next_power_of_2(min(n, 1024)) if interpret else max(1, min(64, 8192 // block_row))
    grid = (layers, triton.cdiv(n, block_n))
    _gather_rotate_kernel[grid](
        pool,
        pool,
        src,
        dst,
        cos,
        sin,
        n,
        slots * row,
        ROW=row,
        HEAD_DIM=head_dim,
        OFFSET=offset,
        WIDTH=width,
        INTERLEAVED=interleaved,
        BLOCK_N=block_n,
        BLOCK_ROW=block_row,
    )


def rotate_copy_triton(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None = None,
) -> None:
    """Triton implementation of :func:`leyline_server.kernels.rotate_copy` (arguments validated there)."""
    src = src_slots.contiguous()
    dst = dst_slots.contiguous()
    width = spec.rotary_dim
    if width:
        cos, sin = (t.contiguous() for t in shift_cos_sin(old_pos, new_pos, spec))
    else:
        cos = sin = torch.empty(1, dtype=torch.float32, device=keys.device)
    launch(
        keys,
        src,
        dst,
        cos,
        sin,
        keys.shape[-1],
        spec.rotary_offset,
        width,
        spec.layout is PairLayout.INTERLEAVED,
    )
    if values is not None:
        launch(values, src, dst, cos, sin, values.shape[-1], 0, 0, False)
