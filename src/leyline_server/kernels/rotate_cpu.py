"""The CPU fast path of :func:`~leyline_server.kernels.rotate_copy`, and :func:`rotate_rows` (shared with llama.cpp).

Same contract and math as the torch reference (:func:`~leyline_server.kernels.rotate_copy_torch`,
the test oracle): the angle of pair j is the exact difference of the model's own fp32 phases,
applied as a unit rotation in fp32 and stored once in the pool's dtype. What differs is the
memory traffic, which is all a rotation on a CPU costs:

* a run of consecutive slots (what the allocator hands out, what a prefill writes) is read and
  written through slices, not gathered with ``index_select`` and scattered with ``index_copy_``;
* interleaved pairs are rotated as one complex multiplication (one pass over the rows);
  half-split pairs as ``x * [c, c]`` plus one ``addcmul_`` per half, written straight into the
  destination rows;
* values and the non-rotary part of the keys are plain copies.

Scattered slots fall back to gather / rotate / scatter, chunk by chunk.
"""

from __future__ import annotations

import torch

from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["rotate_copy_cpu", "rotate_rows", "run_start"]

CPU_CHUNK = 4096  # rows per step: bounds the fp32 temporaries


def run_start(slots: torch.Tensor) -> int | None:
    """``slots[0]`` if ``slots`` is ``slots[0], slots[0] + 1, ...`` (a run), else ``None``."""
    n = slots.numel()
    if n == 0 or int(slots[-1]) - int(slots[0]) != n - 1:
        return None
    return int(slots[0]) if n == 1 or bool((slots.diff() == 1).all()) else None


def _complex_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t [..., W]`` (fp32, pairs adjacent) as complex ``[..., W/2]``, or ``None`` if its strides forbid it."""
    if t.dtype != torch.float32 or t.stride(-1) != 1 or t.storage_offset() % 2 or t.data_ptr() % 8:
        return None
    if any(s % 2 for s in t.stride()[:-1]):
        return None
    return torch.view_as_complex(t.unflatten(-1, (-1, 2)))


def _interleaved(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    rot = torch.complex(cos, sin)[:, None, :]  # [N, 1, W/2]
    xc, oc = _complex_view(x), _complex_view(out)
    if xc is not None and oc is not None:
        torch.mul(xc, rot, out=oc)  # in place too: elementwise, each pair read before it is written
        return
    work = x.to(torch.float32, copy=True)
    wc = torch.view_as_complex(work.unflatten(-1, (-1, 2)))
    wc.mul_(rot)
    out.copy_(work)


def _half_split(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, aliased: bool) -> None:
    half = x.shape[-1] // 2
    both = torch.cat([cos, cos], dim=-1)[:, None, :]
    s = sin[:, None, :]
    xf = x if x.dtype == torch.float32 else x.float()
    direct = out.dtype == torch.float32 and not aliased
    res = out if direct else torch.empty(xf.shape, dtype=torch.float32)
    torch.mul(xf, both, out=res)
    res[..., :half].addcmul_(xf[..., half:], s, value=-1.0)
    res[..., half:].addcmul_(xf[..., :half], s)
    if not direct:
        out.copy_(res)


def rotate_rows(
    x: torch.Tensor,
    lo: int,
    hi: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: PairLayout,
    out: torch.Tensor | None = None,
) -> None:
    """``out = x`` with ``[..., lo:hi]`` rotated (rows ``[N, H, D]``, ``cos``/``sin`` ``[N, (hi - lo) / 2]`` fp32).

    Math in fp32, one rounding into ``out``'s dtype. ``out=None`` rotates ``x`` in place; an
    ``out`` must otherwise not overlap ``x``.
    """
    aliased = out is None
    target = x if out is None else out
    if not aliased:
        if lo:
            target[..., :lo].copy_(x[..., :lo])
        if hi < x.shape[-1]:
            target[..., hi:].copy_(x[..., hi:])
    if hi <= lo:
        return
    if layout is PairLayout.INTERLEAVED:
        _interleaved(x[..., lo:hi], target[..., lo:hi], cos, sin)
    else:
        _half_split(x[..., lo:hi], target[..., lo:hi], cos, sin, aliased)


def _copy_rows(pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, s0: int | None, d0: int | None) -> None:
    n = src.numel()
    if s0 is not None and d0 is not None:
        pool[d0 : d0 + n].copy_(pool[s0 : s0 + n])
    else:
        pool.index_copy_(0, dst, pool.index_select(0, src))


def rotate_copy_cpu(
    keys: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    old_pos: torch.Tensor,
    new_pos: torch.Tensor,
    spec: RopeSpec,
    values: torch.Tensor | None = None,
) -> None:
    """:func:`~leyline_server.kernels.rotate_copy` for CPU tensors (arguments validated there)."""
    from leyline_server.kernels.phases import shift_cos_sin

    lo, hi = spec.rotary_offset, spec.rotary_offset + spec.rotary_dim
    cos, sin = shift_cos_sin(old_pos, new_pos, spec) if spec.rotary_dim else (None, None)
    n = src_slots.numel()
    s0, d0 = run_start(src_slots), run_start(dst_slots)
    in_place = torch.equal(src_slots, dst_slots)
    for layer in range(keys.shape[0]):
        pool = keys[layer]
        for a in range(0, n, CPU_CHUNK):
            b = min(a + CPU_CHUNK, n)
            src, dst = src_slots[a:b], dst_slots[a:b]
            x = pool[s0 + a : s0 + b] if s0 is not None else pool.index_select(0, src)
            if cos is None or sin is None:
                if not in_place:
                    _copy_rows(pool, src, dst, None if s0 is None else s0 + a, None if d0 is None else d0 + a)
                continue
            if in_place:
                rotate_rows(x, lo, hi, cos[a:b], sin[a:b], spec.layout)
                if s0 is None:
                    pool.index_copy_(0, dst, x)
                continue
            out = pool[d0 + a : d0 + b] if d0 is not None else torch.empty_like(x)
            rotate_rows(x, lo, hi, cos[a:b], sin[a:b], spec.layout, out=out)
            if d0 is None:
                pool.index_copy_(0, dst, out)
        if values is not None and not in_place:
            _copy_rows(values[layer], src_slots, dst_slots, s0, d0)
