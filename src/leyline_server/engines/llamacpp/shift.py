"""Moving cells without ``llama_memory_seq_add``: serialise them, reposition the blob, restore it.

``seq_add`` changes positions at once but leaves the keys to llama.cpp, which re-rotates *every
cell of the pool* (unmoved ones by 0) at the next ``llama_decode``, single-threaded: ~16 ms
per 1k pool cells on SmolLM2, whatever moved. :class:`KeyShifter` instead edits a serialised
copy of just the moving cells (:class:`~leyline_server.engines.llamacpp.state.StateBlob`): new
positions, keys rotated by the exact difference of llama.cpp's own RoPE phases (fp32 math, one
rounding into the cache dtype, :func:`~leyline_server.kernels.rotate_cpu.rotate_rows`). The
cost follows the moved cells, not the pool.

llama.cpp's phase of pair ``i`` at position ``p`` is built by repeated fp32 multiplication
(``theta = p; theta *= powf(base, -2/n_rot)`` per pair, ``ggml_rope_cache_init``); the shifter
computes the same numbers. Only plain RoPE (``NORM`` adjacent pairs, ``NEOX`` half-split, no
scaling, no frequency factors) is handled; :meth:`KeyShifter.verify` checks it on the live
context (one token decoded at two positions: every layer's keys must agree after the shift),
and an engine whose check fails keeps ``seq_add``.
"""

from __future__ import annotations

import numpy as np
import torch

from leyline_server.engines.llamacpp.lib import LlamaContext, LlamaModel
from leyline_server.engines.llamacpp.state import StateBlob
from leyline_server.kernels.rotate_cpu import rotate_rows
from leyline_server.rope import PairLayout

__all__ = ["KeyShifter", "unshiftable_reason", "verified_shifter"]

_NORM, _NEOX = 0, 2  # llama_rope_type


class KeyShifter:
    """Repositions serialised cells as llama.cpp's RoPE would have placed them (see the module docstring)."""

    def __init__(self, n_rot: int, freq_base: float, layout: PairLayout, head_dim: int) -> None:
        if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
            raise ValueError(f"rotary dimensions {n_rot} do not fit heads of {head_dim}")
        self.n_rot = n_rot
        self.layout = layout
        self.head_dim = head_dim
        self.theta_scale = np.float32(np.power(np.float32(freq_base), np.float32(-2.0) / np.float32(n_rot)))

    @classmethod
    def for_model(cls, rope_type: int, meta: dict[str, str | None], head_dim: int) -> KeyShifter | None:
        """A shifter for plain RoPE (``meta``: the GGUF's ``rope.*`` values by suffix), else ``None``."""
        if rope_type not in (_NORM, _NEOX):
            return None
        scaling = meta.get("scaling.type")
        factor = meta.get("scaling.factor")
        if scaling not in (None, "none") or (factor is not None and float(factor) != 1.0):
            return None
        n_rot = int(meta.get("dimension_count") or head_dim)
        base = float(meta.get("freq_base") or 10000.0)
        layout = PairLayout.INTERLEAVED if rope_type == _NORM else PairLayout.HALF_SPLIT
        return cls(n_rot, base, layout, head_dim)

    def phases(self, positions: np.ndarray) -> np.ndarray:
        """llama.cpp's fp32 RoPE phases ``[n, n_rot / 2]`` at ``positions``."""
        theta = positions.astype(np.float32)
        out = np.empty((len(theta), self.n_rot // 2), dtype=np.float32)
        for i in range(self.n_rot // 2):
            out[:, i] = theta
            theta = theta * self.theta_scale
        return out

    def shift(self, state: StateBlob, delta: np.ndarray) -> None:
        """Move every cell of ``state`` by ``delta`` (per cell): positions and keys, in place."""
        old = state.positions.astype(np.int64)
        new = old + delta
        if not len(old):
            return
        angle = self.phases(new).astype(np.float64) - self.phases(old).astype(np.float64)
        cos = torch.from_numpy(np.cos(angle).astype(np.float32))
        sin = torch.from_numpy(np.sin(angle).astype(np.float32))
        for rows in state.keys:
            if state.k_type == 30:  # bf16 is stored as 16-bit words: reinterpret them
                tensor = torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
            else:
                tensor = torch.from_numpy(rows)
            heads = tensor.view(len(old), -1, self.head_dim)
            rotate_rows(heads, 0, self.n_rot, cos, sin, self.layout)
        state.positions[:] = new.astype(np.int32)


def verified_shifter(
    model: LlamaModel, ctx: LlamaContext, seqs: tuple[int, int], tolerance: float
) -> KeyShifter | None:
    """The model's :class:`KeyShifter` if its RoPE is plain and the live check passes, else ``None``.

    The check decodes one token alone at two positions (a lone token's hidden states do not
    depend on its position, so only RoPE tells the keys apart) and shifts each blob onto the
    other: every layer's keys must agree within ``tolerance`` (relative, the canary's).
    """
    arch = model.meta("general.architecture") or "llama"
    keys = ("dimension_count", "freq_base", "scaling.type", "scaling.factor")
    meta = {k: model.meta(f"{arch}.rope.{k}") for k in keys}
    shifter = KeyShifter.for_model(model.rope_type, meta, model.head_k)
    if shifter is None:
        return None
    a, b = seqs
    p0, p1 = 3, 2752
    token = model.n_vocab // 2
    try:
        if ctx.decode([(a, token, p0), (b, token, p1)], want_logits=False) != 0:
            return None
        first, second = StateBlob.parse(ctx.state_get(a)), StateBlob.parse(ctx.state_get(b))
        reference = [second.keys_f32(i) for i in range(len(second.keys))]
        shifter.shift(first, np.array([p1 - p0]))
        if int(first.positions[0]) != p1:
            return None
        for got, want in zip((first.keys_f32(i) for i in range(len(first.keys))), reference, strict=True):
            if not float(np.abs(got - want).max()) <= tolerance * max(float(np.abs(want).max()), 1e-6):
                return None
    except ValueError:
        return None
    finally:
        ctx.seq_rm(a)
        ctx.seq_rm(b)
    return shifter


def unshiftable_reason(window: int) -> str:
    """Why the llama.cpp engine serves a model's splices as forget."""
    if window:
        return (
            f"sliding-window layers (window {window}): llama.cpp keeps only the last {window} positions' KV of "
            "those layers, which a splice may bring back into the window; its splices are served as forget "
            "(the embedded engine splices such models)"
        )
    return (
        "llama.cpp cannot shift this model's KV cache (llama_memory_can_shift is false: M-RoPE or recurrent "
        "memory): its splices are served as forget"
    )
