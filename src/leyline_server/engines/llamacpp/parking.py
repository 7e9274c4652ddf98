"""When to park idle sequences out of the llama.cpp pool, so that they do not slow the active one.

llama.cpp's decode attends over every cell of the unified pool up to the highest one in use
(``n_kv`` is the highest used cell index + 1, padded), masking the cells of other sequences but
still reading them. On SmolLM2-135M, 4,000 cells of two idle 2k-token sessions halve the decode
speed of a 1k-token one. Before the engine computes for an entry (a turn's prefill, a splice),
:func:`focus` estimates what the idle resident entries cost each decode step,

    slowdown = idle cells x bytes per cell / (weights + active cells x bytes per cell),

and when it is above ``threshold`` parks them (their KV goes to host memory, within the cache's
budget; they stay matchable and come back when used), then moves the entry's own cells to the
bottom of the pool (:meth:`SequenceCache.compact`). Entries a stream is decoding are never
parked; while another stream is in flight nothing is compacted (that would need the pool empty).
"""

from __future__ import annotations

from dataclasses import dataclass

from leyline_server.engines.llamacpp.cache import Entry, SequenceCache

__all__ = ["ParkingPolicy", "focus"]


@dataclass(frozen=True)
class ParkingPolicy:
    """The cost model: the weights each decode step reads, KV bytes per cell, the slowdown tolerated."""

    weight_bytes: int
    cell_bytes: int
    threshold: float = 0.05

    def slowdown(self, idle_cells: int, active_cells: int) -> float:
        """The fraction of decode time idle cells add (memory traffic per step)."""
        return idle_cells * self.cell_bytes / max(self.weight_bytes + active_cells * self.cell_bytes, 1)


def _private_cells(entry: Entry, others: set[Entry]) -> int:
    """Cells of ``entry`` no entry of ``others`` shares (parking would free about these)."""
    shared = max((m for e, m in entry.links.items() if e in others), default=0)
    return entry.cached - shared


def focus(cache: SequenceCache, entry: Entry, policy: ParkingPolicy, scratch: int) -> int:
    """Make ``entry`` resident and, if idle entries cost more than the threshold, park them; how many went.

    ``scratch``: an empty reserved sequence (pending key shifts are applied there first).
    """
    cache.unpark(entry)
    idle = [e for e in cache.entries.values() if e is not entry and e.resident and e.cached and not e.busy]
    if not idle or cache.park_budget <= 0:
        return 0
    active = {e for e in cache.entries.values() if e.resident and e.cached and e not in idle}
    idle_cells = sum(_private_cells(e, active) for e in idle)
    active_cells = sum(e.cached for e in active)
    if policy.slowdown(idle_cells, active_cells) < policy.threshold:
        return 0
    cache.settle(scratch)
    parked = sum(cache.park(e, protect=(entry,)) for e in sorted(idle, key=lambda e: e.used))
    if parked and entry.cached and not any(e.resident and e.cached for e in cache.entries.values() if e is not entry):
        cache.compact(entry)
    return parked
