"""The math every rotation path shares: the exact shift angles, the in-place fp32 rotation of a slice.

Kept apart from the kernels so that the torch path, the Triton kernel and the per-layer variant
all import it without importing each other.
"""

from __future__ import annotations

import os

import torch

from leyline_server.rope import PairLayout, RopeSpec

__all__ = ["CHUNK", "shift_cos_sin", "rotate_slice_", "triton_usable"]


def shift_cos_sin(old_pos: torch.Tensor, new_pos: torch.Tensor, spec: RopeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each token's per-pair shift angle, ``[N, rotary_dim // 2]`` fp32.

    Phases are formed exactly as the model forms them (fp32 position times fp32 inverse
    frequency, rounded to fp32); their difference is taken in fp64, where it is exact.
    """
    inv_freq = spec.inv_freq_tensor(old_pos.device)
    phase_new = new_pos.to(torch.float32)[:, None] * inv_freq[None, :]
    phase_old = old_pos.to(torch.float32)[:, None] * inv_freq[None, :]
    angle = phase_new.to(torch.float64) - phase_old.to(torch.float64)
    return torch.cos(angle).to(torch.float32), torch.sin(angle).to(torch.float32)


CHUNK = 512  # tokens per step: keeps each step's fp32 temporaries cache-sized


def rotate_slice_(x: torch.Tensor, lo: int, hi: int, cos: torch.Tensor, sin: torch.Tensor, layout: PairLayout) -> None:
    """Rotate ``x[..., lo:hi]`` in place (math in fp32): ``x [N, H, D]``, ``cos/sin [N, W/2]``."""
    xf = x[..., lo:hi].to(torch.float32)
    c, s = cos[:, None, :], sin[:, None, :]
    if layout is PairLayout.INTERLEAVED:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        half = (hi - lo) // 2
        x1, x2 = xf[..., :half], xf[..., half:]
    y1 = (x1 * c).addcmul_(x2, s, value=-1.0)
    y2 = (x2 * c).addcmul_(x1, s)
    if layout is PairLayout.INTERLEAVED:
        x[..., lo:hi][..., 0::2] = y1
        x[..., lo:hi][..., 1::2] = y2
    else:
        x[..., lo : lo + half] = y1
        x[..., lo + half : hi] = y2


def triton_usable(device: torch.device) -> bool:
    """Whether the Triton kernel can run on ``device`` (CUDA, or the CPU interpreter)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
