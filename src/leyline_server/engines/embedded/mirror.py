"""Mirrors: contiguous copies of a sequence's KV, so a forward does not re-gather its context from the pool.

The slot pool is the source of truth, but attention wants each layer's context as one
``[heads, tokens, dim]`` tensor. A :class:`Mirror` is that tensor for the exact slot list
``slots[:length]``, plus the pool *generation* of each row when it was copied (``SlotPool.alloc``
stamps every slot it hands out, so a freed, reallocated and rewritten slot never serves a stale
row). :meth:`MirrorStore.acquire` finds the mirror holding the longest valid prefix of a forward's
context:

* the whole mirror — a decode step, the same session's next turn: append in place;
* part of it — a splice kept only the prefix, two sessions share a system prompt: fork (copy the
  prefix to a new mirror) when the byte budget keeps both, else truncate in place;
* nothing — a new mirror (least recently used ones evicted), gathered once from the pool.

Memory: at most ``max_mirrors`` mirrors and ``max_bytes`` (default: the pool's size).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from leyline_server.engines.embedded.pool import PoolLayout, SlotPool

__all__ = ["Mirror", "MirrorStats", "MirrorStore"]

_GROW = 256  # capacity is rounded up to a multiple of this many tokens
_HEADROOM = 512  # a new mirror leaves room for this many more tokens (decode without regrowing)
_GATHER_CHUNK = 1024  # tokens per gather step (bounds the temporary of index_select)


def _rounded(tokens: int) -> int:
    """A capacity of at least ``tokens`` (and at least one), in multiples of ``_GROW``."""
    return -(-max(tokens, 1) // _GROW) * _GROW


def _mirror_shapes(layout: PoolLayout) -> tuple[int, int, int, int]:
    """(key heads, key dim, value heads, value dim) of the cache tensors transformers uses."""
    if layout.mla_latent:  # DeepSeek MLA: "keys" = latent [1, latent], "values" = k_pe [1, rope]
        return 1, layout.mla_latent, 1, layout.row - layout.mla_latent
    return layout.heads, layout.row, layout.value_heads, layout.value_row


@dataclass(eq=False)  # identity: mirrors are compared and removed as objects, never by their tensors
class Mirror:
    """A contiguous copy of the KV rows of the slot list ``slots[:length]`` (all layers).

    ``keys [L, Hk, capacity, Dk]`` and ``values [L, Hv, capacity, Dv]`` are what transformers'
    attention reads (``[batch=1, heads, tokens, dim]`` per layer, as views); ``gens`` holds the pool
    generation of each row when it was copied or written.
    """

    keys: torch.Tensor
    values: torch.Tensor
    slots: torch.Tensor
    gens: torch.Tensor
    length: int = 0
    last_used: int = 0

    @classmethod
    def empty(cls, pool: SlotPool, capacity: int) -> Mirror:
        """A mirror able to hold ``capacity`` tokens (rounded up), holding none."""
        capacity = _rounded(capacity)
        hk, dk, hv, dv = _mirror_shapes(pool.layout)
        layers, device, dtype = pool.layout.layers, pool.keys.device, pool.dtype
        return cls(
            keys=torch.empty(layers, hk, capacity, dk, dtype=dtype, device=device),
            values=torch.empty(layers, hv, capacity, dv, dtype=dtype, device=device),
            slots=torch.full((capacity,), -1, dtype=torch.int64),
            gens=torch.zeros(capacity, dtype=torch.int64),
        )

    @property
    def capacity(self) -> int:
        """Tokens the buffers can hold without growing."""
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes held by the KV buffers."""
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def reserve(self, n: int) -> None:
        """Grow (×1.5 at least) so that ``n`` tokens fit; keeps rows ``[0, length)``."""
        if n <= self.capacity:
            return
        capacity = _rounded(max(n, self.capacity * 3 // 2))
        keys = self.keys.new_empty(self.keys.shape[0], self.keys.shape[1], capacity, self.keys.shape[3])
        values = self.values.new_empty(self.values.shape[0], self.values.shape[1], capacity, self.values.shape[3])
        keys[:, :, : self.length].copy_(self.keys[:, :, : self.length])
        values[:, :, : self.length].copy_(self.values[:, :, : self.length])
        slots = torch.full((capacity,), -1, dtype=torch.int64)
        gens = torch.zeros(capacity, dtype=torch.int64)
        slots[: self.length] = self.slots[: self.length]
        gens[: self.length] = self.gens[: self.length]
        self.keys, self.values, self.slots, self.gens = keys, values, slots, gens

    def valid_prefix(self, context: torch.Tensor, generation: torch.Tensor) -> int:
        """Length of the longest prefix of ``context`` this mirror holds with current pool rows."""
        k = min(self.length, int(context.numel()))
        if k == 0:
            return 0
        ours, theirs = self.slots[:k], context[:k]
        same = (ours == theirs) & (self.gens[:k] == generation.index_select(0, theirs.clamp(min=0)))
        if bool(same.all()):
            return k
        return int(torch.argmin(same.to(torch.uint8)))  # first mismatch

    def commit(self, slots: torch.Tensor, generation: torch.Tensor, start: int) -> None:
        """Own the rows a forward just appended at ``start`` (called after it returned)."""
        end = start + int(slots.numel())
        self.slots[start:end] = slots.to(torch.int64).cpu()
        self.gens[start:end] = generation.index_select(0, self.slots[start:end])
        self.length = end

    def copy_prefix_from(self, other: Mirror, m: int) -> None:
        """Take rows ``[0, m)`` of ``other`` (contiguous copies, no gather)."""
        self.reserve(m)
        self.keys[:, :, :m].copy_(other.keys[:, :, :m])
        self.values[:, :, :m].copy_(other.values[:, :, :m])
        self.slots[:m] = other.slots[:m]
        self.gens[:m] = other.gens[:m]
        self.length = m


def _gather(mirror: Mirror, pool: SlotPool, context: torch.Tensor, start: int) -> None:
    """Copy the pool rows of ``context[start:]`` into ``mirror`` rows ``[start, len(context))``."""
    n = int(context.numel())
    mirror.reserve(n)
    latent = pool.layout.mla_latent
    for a in range(start, n, _GATHER_CHUNK):
        b = min(a + _GATHER_CHUNK, n)
        idx = context[a:b].to(pool.keys.device)
        rows = pool.keys.index_select(1, idx)  # [L, t, H, D]
        if latent:
            k, v = rows[..., :latent], rows[..., latent:]
        else:
            assert pool.values is not None
            k, v = rows, pool.values.index_select(1, idx)
        mirror.keys[:, :, a:b].copy_(k.permute(0, 2, 1, 3))
        mirror.values[:, :, a:b].copy_(v.permute(0, 2, 1, 3))
    mirror.slots[start:n] = context[start:n].cpu()
    mirror.gens[start:n] = pool.generation.index_select(0, context[start:n].cpu())
    mirror.length = n


@dataclass
class MirrorStats:
    """Counters: how each forward's context was obtained."""

    appends: int = 0  # context == a mirror: nothing copied
    forks: int = 0
    truncations: int = 0
    misses: int = 0  # no usable mirror: gathered from scratch
    gathered_rows: int = 0  # context rows copied from the pool
    forked_rows: int = 0  # rows copied mirror-to-mirror
    evictions: int = 0
    grows: int = 0  # buffer reallocations (x1.5) to fit a longer sequence


class MirrorStore:
    """The mirrors of one pool: at most ``max_mirrors`` of them and ``max_bytes`` of buffers (LRU)."""

    def __init__(self, pool: SlotPool, max_mirrors: int = 4, max_bytes: int | None = None) -> None:
        self.pool = pool
        self.max_mirrors = max(1, max_mirrors)
        pool_bytes = pool.keys.numel() * pool.keys.element_size()
        if pool.values is not None:
            pool_bytes += pool.values.numel() * pool.values.element_size()
        self.max_bytes = max_bytes if max_bytes is not None else pool_bytes
        self.mirrors: list[Mirror] = []
        self.stats = MirrorStats()
        self._clock = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by all mirrors."""
        return sum(m.nbytes for m in self.mirrors)

    def clear(self) -> None:
        """Drop every mirror (e.g. after an operation that rewrote pool rows without ``touch``)."""
        self.mirrors.clear()

    def _bytes_for(self, tokens: int) -> int:
        hk, dk, hv, dv = _mirror_shapes(self.pool.layout)
        return self.pool.layout.layers * _rounded(tokens) * (hk * dk + hv * dv) * self.pool.keys.element_size()

    def _make_room(self, tokens: int, keep: Collection[Mirror] = ()) -> Mirror | None:
        """Evict LRU mirrors (never one in ``keep``) until a ``tokens`` mirror fits; return one to recycle."""
        need = self._bytes_for(tokens)
        recycled: Mirror | None = None
        while self.mirrors and (len(self.mirrors) >= self.max_mirrors or self.nbytes + need > self.max_bytes):
            victims = [m for m in self.mirrors if not any(m is k for k in keep)]
            if not victims:
                break
            victim = min(victims, key=lambda m: m.last_used)
            self.mirrors.remove(victim)
            self.stats.evictions += 1
            if victim.capacity >= tokens and (recycled is None or victim.capacity < recycled.capacity):
                recycled = victim
        return recycled

    def _can_keep_both(self, tokens: int) -> bool:
        """Whether a new mirror of ``tokens`` fits beside the existing ones without eviction."""
        return len(self.mirrors) < self.max_mirrors and self.nbytes + self._bytes_for(tokens) <= self.max_bytes

    def acquire(self, context: torch.Tensor, extra: int, keep: Collection[Mirror] = ()) -> Mirror:
        """A mirror holding exactly ``context`` (valid rows) with room for ``extra`` more tokens.

        ``keep``: mirrors other sequences of the same forward hold; none of them is appended to,
        truncated or evicted (a context they share a prefix with gets a fork).
        """
        context = context.to(torch.int64).cpu()
        n = int(context.numel())
        self._clock += 1
        best, best_m = None, 0
        for mirror in self.mirrors:
            m = mirror.valid_prefix(context, self.pool.generation)
            if best is None or m > best_m:
                best, best_m = mirror, m
        held = best is not None and any(best is k for k in keep)
        if best is not None and best_m > 0:
            if best_m == best.length and not held:  # context extends the mirror (decode, next turn)
                target = best
                if best_m == n:
                    self.stats.appends += 1
            elif held or self._can_keep_both(n + extra + _HEADROOM):  # branch: keep the other branch's rows
                if held:
                    self._make_room(n + extra + _HEADROOM, keep=[*keep])
                target = Mirror.empty(self.pool, n + extra + _HEADROOM)
                target.copy_prefix_from(best, best_m)
                self.mirrors.append(target)
                self.stats.forks += 1
                self.stats.forked_rows += best_m
            else:  # branch without room for two: this context wins
                target = best
                target.length = best_m
                self.stats.truncations += 1
        else:
            self.stats.misses += 1
            target = self._make_room(n + extra + _HEADROOM, keep) or Mirror.empty(self.pool, n + extra + _HEADROOM)
            target.length = 0
            self.mirrors.append(target)
            best_m = 0
        if best_m < n:
            self.stats.gathered_rows += n - best_m
            _gather(target, self.pool, context, best_m)
        before = target.capacity
        target.reserve(n + extra)
        if target.capacity != before:
            self.stats.grows += 1
        target.last_used = self._clock
        return target
