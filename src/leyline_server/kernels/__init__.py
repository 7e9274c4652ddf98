"""Rotation kernels: ``rotate_copy`` (fused gather–copy–rotate over a slot pool), ``rotate_copy_layers``
(the same over per-layer buffers, as SGLang keeps them) and their parts."""

from leyline_server.kernels.rotate import Backend, rotate_copy, rotate_copy_torch, shift_cos_sin
from leyline_server.kernels.rotate_layers import rotate_copy_layers

__all__ = ["Backend", "rotate_copy", "rotate_copy_layers", "rotate_copy_torch", "shift_cos_sin"]
