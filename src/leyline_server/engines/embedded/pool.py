"""Slot pool: per-token KV rows for every layer, in the layout the model's cache uses, plus an allocator.

::

    keys   [L, S, H, D]    MLA: H = 1, D = kv_lora_rank + qk_rope_head_dim   rows = [latent | k_pe]
                           GQA: H = kv heads, D = head_dim                   rows = post-RoPE K
    values [L, S, Hv, Dv]  GQA only (MLA rebuilds V from the latent)
    rotations [S]          how often each slot's key was δ-rotated (drift budget)
    generation [S]         a stamp renewed whenever a slot's rows may change (mirrors check it)

A slot is free or owned (by one radix node, or transiently by a request that allocated it).
``alloc`` returns ``None`` when the pool is full, never raises: callers turn that into the
``capacity`` fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PoolLayout", "SlotPool", "layout_from_config"]


@dataclass(frozen=True)
class PoolLayout:
    """Shape of one token's KV in one layer."""

    layers: int
    heads: int
    row: int
    value_heads: int = 0  # 0: no separate values (MLA)
    value_row: int = 0
    mla_latent: int = 0  # MLA: width of the latent at the start of the row

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        """Bytes one slot takes over all layers."""
        size = torch.tensor([], dtype=dtype).element_size()
        return self.layers * (self.heads * self.row + self.value_heads * self.value_row) * size


def layout_from_config(config: object) -> PoolLayout:
    """The pool layout that matches transformers' cache for ``config``."""
    layers = int(config.num_hidden_layers)  # type: ignore[attr-defined]
    if getattr(config, "kv_lora_rank", None):
        latent = int(config.kv_lora_rank)  # type: ignore[attr-defined]
        return PoolLayout(layers, 1, latent + int(config.qk_rope_head_dim), mla_latent=latent)  # type: ignore[attr-defined]
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)  # type: ignore[attr-defined]
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)  # type: ignore[attr-defined]
    return PoolLayout(layers, heads, head_dim, heads, head_dim)


class SlotPool:
    """KV storage for ``capacity`` tokens and the free list that hands slots out."""

    def __init__(
        self,
        layout: PoolLayout,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.layout = layout
        self.capacity = capacity
        self.dtype = dtype
        self.keys = torch.zeros(layout.layers, capacity, layout.heads, layout.row, dtype=dtype, device=device)
        self.values = (
            torch.zeros(
                layout.layers,
                capacity,
                layout.value_heads,
                layout.value_row,
                dtype=dtype,
                device=device,
            )
            if layout.value_heads
            else None
        )
        self.rotations = torch.zeros(capacity, dtype=torch.int32)
        self.generation = torch.zeros(capacity, dtype=torch.int64)  # renewed whenever a slot may change
        self._clock = 0
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() hands out low slots first

    @classmethod
    def from_budget(
        cls,
        layout: PoolLayout,
        budget_mb: float,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> SlotPool:
        """A pool as large as ``budget_mb`` megabytes of KV allows."""
        capacity = int(budget_mb * 2**20) // layout.bytes_per_slot(dtype)
        if capacity < 1:
            raise ValueError(f"a KV budget of {budget_mb} MB holds no token ({layout.bytes_per_slot(dtype)} B/token)")
        return cls(layout, capacity, dtype, device)

    @property
    def available(self) -> int:
        """Number of free slots."""
        return len(self._free)

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` free slots as an int64 tensor, or ``None`` if fewer are free."""
        if n > len(self._free):
            return None
        taken = self._free[len(self._free) - n :][::-1]
        del self._free[len(self._free) - n :]
        slots = torch.tensor(taken, dtype=torch.int64)
        self.rotations[slots] = 0
        self.touch(slots)
        return slots

    def touch(self, slots: torch.Tensor) -> None:
        """Mark the rows of ``slots`` as changed (copies of them elsewhere become stale).

        ``alloc`` does it for every slot it hands out; every writer in the engine writes only
        freshly allocated slots, so a row can only change after a new stamp.
        """
        self._clock += 1
        self.generation[slots.to(torch.int64).cpu()] = self._clock

    def free(self, slots: torch.Tensor) -> None:
        """Return ``slots`` to the free list (in reverse: a run freed comes back as the same run,
        which the rotation and the mirrors read and write as slices)."""
        self._free.extend(reversed(slots.tolist()))

    def free_slots(self) -> set[int]:
        """The free slots (for integrity checks)."""
        return set(self._free)
