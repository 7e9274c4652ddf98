"""Rotation kernels: ``rotate_copy`` (fused gather–copy–rotate over a slot pool) and its parts."""

from leyline_server.kernels.rotate import Backend, rotate_copy, rotate_copy_torch, shift_cos_sin

__all__ = ["Backend", "rotate_copy", "rotate_copy_torch", "shift_cos_sin"]
