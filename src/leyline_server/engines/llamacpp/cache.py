"""Sequences as cache entries: prefix matching, sharing, LRU eviction, decoding with room-making.

Every cached token sequence lives in one llama.cpp sequence of the unified KV pool, as an
:class:`Entry`. A *pinned* entry belongs to a live handle; an unpinned one is ordinary cache,
matched by later prefills and evicted least recently used first when sequence ids or cells run out.

**Sharing.** A new entry reuses the matched prefix of another with ``llama_memory_seq_cp``: the
cells then belong to both sequences (no copy). A cell has *one* position, so a shared cell moves
for every sequence holding it: ``Entry.links`` records, for each other entry, the leading
positions ``[0, m)`` the two share (sharing is always a common prefix at identical positions, and
links are kept transitively closed). Splices only move cells past every link
(:meth:`SequenceCache.unshare_after`): unpinned sharers are trimmed, pinned ones keep their cells
while the splicing entry gets a private copy made through the state API.

**Privacy.** Exact KV (``[0, exact)``) is matched by every request with the same salt; KV past
``exact`` (rotated, or computed after a rotation) only by requests carrying the entry's private tag.

**Parking.** llama.cpp's decode attends over every cell of the pool up to the highest one in use,
whatever sequence holds it, so idle entries slow every decode. An entry can be *parked*: its
cells are serialised to host memory (the state API) and removed from the pool; it stays
matchable, and is restored (``unpark``) or copied into another sequence (``restore_prefix``)
when used. Parked bytes are bounded by ``park_budget``; when to park is
:mod:`~leyline_server.engines.llamacpp.parking`'s decision.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from leyline_server.contract.values import CacheScope, CapacityError
from leyline_server.engines.llamacpp.lib import LlamaContext

__all__ = ["Entry", "SequenceCache", "LIFT_BUFFER_MAX"]

LIFT_BUFFER_MAX = 512 << 20  # the largest move whose serialised cells reuse one host buffer


@dataclass(eq=False)
class Entry:
    """One llama.cpp sequence holding KV for ``tokens`` at positions ``[0, len(tokens))``."""

    seq: int
    tokens: np.ndarray
    exact: int
    scope: CacheScope
    rotations: np.ndarray
    pinned: bool = True
    used: int = 0
    links: dict[Entry, int] = field(default_factory=dict)
    blob: np.ndarray | None = None  # the KV while parked out of the pool
    busy: int = 0  # decode streams in flight on this entry (never parked meanwhile)

    @property
    def cached(self) -> int:
        """Tokens with KV (in the pool, or in ``blob`` while parked)."""
        return len(self.tokens)

    @property
    def resident(self) -> bool:
        """Whether the entry's cells are in the pool (an empty entry counts as resident)."""
        return self.blob is None

    def set_tokens(self, tokens: Sequence[int] | np.ndarray, exact: int, rotations: np.ndarray | None = None) -> None:
        """Replace the entry's description (after a splice or an extension)."""
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.exact = min(exact, len(self.tokens))
        n = len(self.tokens)
        self.rotations = np.zeros(n, dtype=np.int32) if rotations is None else rotations[:n].astype(np.int32)

    def append(self, tokens: Sequence[int]) -> None:
        """Describe ``tokens`` just decoded after the cached ones (unrotated; exact iff all before were)."""
        exact = self.exact + len(tokens) if self.exact >= self.cached else self.exact
        rotations = np.concatenate([self.rotations, np.zeros(len(tokens), dtype=np.int32)])
        self.set_tokens(np.concatenate([self.tokens, np.asarray(tokens, dtype=np.int64)]), exact, rotations)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class SequenceCache:
    """The entries of one context; sequence ids ``[reserved, n_seq_max)`` hold entries."""

    def __init__(self, ctx: LlamaContext, reserved: int, park_budget: int = 0) -> None:
        self.ctx = ctx
        self.park_budget = park_budget  # bytes of host memory parked entries may take
        self.parked_bytes = 0
        self.entries: dict[int, Entry] = {}
        self._free = list(range(ctx.config.n_seq_max - 1, reserved - 1, -1))
        self._clock = itertools.count(1)
        self._lift = np.empty(0, dtype=np.uint8)
        if not self._free:
            raise ValueError("no sequence ids left for cache entries")

    def lift_buffer(self, n: int) -> np.ndarray | None:
        """A host buffer of at least ``n`` bytes reused by every splice's moved cells, or ``None``
        above ``LIFT_BUFFER_MAX`` (such moves allocate their own).

        Fresh host memory is what serialising costs most: 133 MB of new pages took 0.25-0.4 s to
        fault in on the development machine, the serialisation itself 15 ms.
        """
        if n > LIFT_BUFFER_MAX:
            return None
        if self._lift.nbytes < n:
            self._lift = np.empty(min(max(n, self._lift.nbytes * 5 // 4), LIFT_BUFFER_MAX), dtype=np.uint8)
        return self._lift

    def touch(self, entry: Entry) -> None:
        """Mark ``entry`` as just used (LRU order)."""
        entry.used = next(self._clock)

    # -- matching ---------------------------------------------------------------------------------
    @staticmethod
    def visible(entry: Entry, tokens: np.ndarray, scope: CacheScope) -> int:
        """How many leading ``tokens`` a request in ``scope`` may reuse from ``entry``."""
        if entry.scope.salt != scope.salt:
            return 0
        common = common_prefix(entry.tokens, tokens)
        if scope.private is not None and entry.scope.private == scope.private:
            return common
        return min(common, entry.exact)

    def best_match(self, tokens: Sequence[int], scope: CacheScope, prefer: Entry | None) -> tuple[Entry | None, int]:
        """The entry sharing the longest visible prefix with ``tokens`` (ties: ``prefer``, then unpinned)."""
        array = np.asarray(tokens, dtype=np.int64)
        best, best_key = None, (0, False, False)
        for entry in self.entries.values():
            n = self.visible(entry, array, scope)
            key = (n, entry is prefer, not entry.pinned)
            if n and key > best_key:
                best, best_key = entry, key
        return best, best_key[0]

    # -- allocation and eviction --------------------------------------------------------------------
    def new_entry(self, scope: CacheScope, protect: Collection[Entry] = ()) -> Entry:
        """An empty pinned entry on a free sequence id (evicting the least recently used if needed)."""
        while not self._free:
            if not self.evict_one(protect):
                raise CapacityError(f"all {len(self.entries)} llama.cpp sequences are held by live sessions")
        seq = self._free.pop()
        entry = Entry(seq, np.zeros(0, dtype=np.int64), 0, scope, np.zeros(0, dtype=np.int32))
        self.entries[seq] = entry
        self.touch(entry)
        return entry

    def evict_one(self, protect: Collection[Entry] = (), cells: bool = False) -> bool:
        """Drop the least recently used unpinned entry not in ``protect``; ``False`` if there is none.

        ``cells``: only entries holding cells in the pool count (making room for KV).
        """
        candidates = [
            e
            for e in self.entries.values()
            if not e.pinned and not e.busy and e not in protect and (not cells or (e.resident and e.cached))
        ]
        if not candidates:
            return False
        self.drop(min(candidates, key=lambda e: e.used))
        return True

    def evict_all(self) -> int:
        """Drop every unpinned entry, resident or parked; how many went."""
        dropped = 0
        while self.evict_one():
            dropped += 1
        return dropped

    def make_room(self, protect: Collection[Entry] = ()) -> bool:
        """Free cells: evict an unpinned entry, else park an idle pinned one; ``False`` if neither can be done."""
        if self.evict_one(protect, cells=True):
            return True
        idle = [e for e in self.entries.values() if e.resident and e.cached and not e.busy and e not in protect]
        return any(self.park(e, protect) for e in sorted(idle, key=lambda e: e.used))

    def drop(self, entry: Entry) -> None:
        """Remove ``entry``'s sequence from the pool (or its parked KV) and forget it."""
        self.ctx.seq_rm(entry.seq)
        self._unlink(entry)
        self._free_blob(entry)
        entry.set_tokens([], 0)
        del self.entries[entry.seq]
        self._free.append(entry.seq)

    # -- parking ----------------------------------------------------------------------------------
    def park(self, entry: Entry, protect: Collection[Entry] = ()) -> bool:
        """Move ``entry``'s KV out of the pool into host memory; ``False`` if the budget cannot hold it.

        Parked unpinned entries not in ``protect`` are dropped (least recently used first) to make
        budget room. Cells ``entry`` shared with other entries stay in the pool for them.
        """
        if not entry.resident or entry.busy or not entry.cached or self.ctx.shift_pending:
            return False  # (with a shift pending the serialised keys would be stale: settle() first)
        need = self.ctx.state_size(entry.seq)
        while self.parked_bytes + need > self.park_budget:
            parked = [e for e in self.entries.values() if not e.resident and not e.pinned and e not in protect]
            if not parked:
                return False
            self.drop(min(parked, key=lambda e: e.used))
        entry.blob = self.ctx.state_get(entry.seq)
        self.parked_bytes += entry.blob.nbytes
        self.ctx.seq_rm(entry.seq)
        self._unlink(entry)
        return True

    def unpark(self, entry: Entry, protect: Collection[Entry] = ()) -> None:
        """Bring a parked entry's KV back into its sequence (making room if needed)."""
        if entry.resident:
            return
        assert entry.blob is not None
        self._restore(entry.blob, entry.seq, (entry, *protect))
        self._free_blob(entry)

    def restore_prefix(self, src: Entry, dst: Entry, n: int, protect: Collection[Entry] = ()) -> None:
        """Make empty ``dst`` hold a private copy of parked ``src``'s first ``n`` tokens."""
        self.restore_range(src, dst.seq, 0, n, (dst, *protect))
        dst.set_tokens(src.tokens[:n], min(src.exact, n), src.rotations)

    def restore_range(self, src: Entry, dst_seq: int, p0: int, p1: int, protect: Collection[Entry] = ()) -> None:
        """Make the empty ``dst_seq`` hold a copy of parked ``src``'s cells at positions ``[p0, p1)``."""
        assert src.blob is not None
        self._restore(src.blob, dst_seq, (src, *protect))
        self.ctx.seq_rm(dst_seq, p1, -1)
        if p0:
            self.ctx.seq_rm(dst_seq, 0, p0)

    def compact(self, entry: Entry) -> None:
        """Re-place ``entry``'s cells at the bottom of the pool; no other entry may hold cells.

        Decode cost follows the highest cell index in use, so after the others were parked the
        entry's cells are moved down: serialised, the pool cleared, restored from index 0.
        """
        if any(e.resident and e.cached for e in self.entries.values() if e is not entry) or self.ctx.shift_pending:
            raise AssertionError("compact() needs every other entry parked and no shift pending")
        if not entry.cached:
            self.ctx.clear()
            return
        blob = self.ctx.state_get(entry.seq)
        self.ctx.clear()
        if not self.ctx.state_set(blob, entry.seq):
            raise RuntimeError("llama.cpp could not restore a sequence into an empty pool")

    def settle(self, scratch: int) -> None:
        """Apply pending key re-rotations now (one token decoded in the empty ``scratch`` sequence)."""
        if self.ctx.shift_pending:
            self.ctx.seq_rm(scratch)
            self.decode_batch([(scratch, 0, 0)], want_logits=False)
            self.ctx.seq_rm(scratch)

    def _restore(self, blob: np.ndarray, seq: int, protect: Collection[Entry]) -> None:
        while not self.ctx.state_set(blob, seq):
            if not self.make_room(protect):
                raise CapacityError("no room in the KV pool to restore a parked sequence")

    def _free_blob(self, entry: Entry) -> None:
        if entry.blob is not None:
            self.parked_bytes -= entry.blob.nbytes
            entry.blob = None

    def _unlink(self, entry: Entry) -> None:
        for other in entry.links:
            other.links.pop(entry, None)
        entry.links.clear()

    def release(self, entry: Entry) -> None:
        """Unpin ``entry``: it stays as evictable cache (an empty one is dropped)."""
        entry.pinned = False
        self.touch(entry)
        if entry.cached == 0:
            self.drop(entry)

    # -- sharing ----------------------------------------------------------------------------------
    def share(self, src: Entry, dst: Entry, n: int) -> None:
        """Make empty ``dst`` hold ``src``'s first ``n`` tokens (shared cells)."""
        self.ctx.seq_cp(src.seq, dst.seq, 0, n)
        dst.set_tokens(src.tokens[:n], min(src.exact, n), src.rotations)
        self._link(dst, src, n)
        for other, m in list(src.links.items()):
            if other is not dst:
                self._link(dst, other, min(m, n))

    @staticmethod
    def _link(a: Entry, b: Entry, n: int) -> None:
        if n > 0:
            a.links[b] = b.links[a] = n
        else:
            a.links.pop(b, None)
            b.links.pop(a, None)

    def trim(self, entry: Entry, n: int) -> None:
        """Keep only ``entry``'s first ``n`` tokens (a parked entry is restored first, unless ``n`` is 0)."""
        if not entry.resident:
            if n == 0:
                self._free_blob(entry)
            else:
                self.unpark(entry)
        if n < entry.cached:
            self.ctx.seq_rm(entry.seq, n, -1)
            entry.set_tokens(entry.tokens[:n], entry.exact, entry.rotations)
        for other, m in list(entry.links.items()):
            self._link(entry, other, min(m, n))

    def unshare_after(self, entry: Entry, start: int, scratch: int) -> None:
        """Make ``entry``'s cells from position ``start`` on its own, so that they may move.

        Unpinned sharers are trimmed to ``start``; cells shared with pinned entries are copied
        into fresh cells for ``entry`` (the others keep the originals where they are).
        """
        pinned_end = start
        for other, m in list(entry.links.items()):
            if m <= start:
                continue
            if other.pinned:
                pinned_end = max(pinned_end, m)
            else:
                self.trim(other, start)
        if pinned_end > start:
            self.copy_cells(entry.seq, start, pinned_end, scratch)
            self.ctx.seq_rm(entry.seq, start, pinned_end)
            self.ctx.seq_cp(scratch, entry.seq, start, pinned_end)
            self.ctx.seq_rm(scratch)
        for other, m in list(entry.links.items()):
            self._link(entry, other, min(m, start))

    def copy_cells(self, src_seq: int, p0: int, p1: int, scratch: int, protect: Collection[Entry] = ()) -> None:
        """Fresh copies of ``src_seq``'s cells at ``[p0, p1)`` into the (emptied) ``scratch`` sequence.

        Goes through the state API (``seq_state_get`` of a temporary sequence holding just those
        cells, then ``seq_state_set``), the only way llama.cpp copies cell data. The cells must
        not have a pending position shift (the state API writes the keys as they are stored).
        """
        self.ctx.seq_rm(scratch)
        self.ctx.seq_cp(src_seq, scratch, p0, p1)
        blob = self.ctx.state_get(scratch)
        self.ctx.seq_rm(scratch)
        while not self.ctx.state_set(blob, scratch):
            if not self.make_room(protect):
                raise CapacityError(f"no room to copy {p1 - p0} KV cells")

    # -- decoding ---------------------------------------------------------------------------------
    def decode(
        self,
        seq: int,
        tokens: Sequence[int],
        pos0: int,
        want_logits: bool,
        protect: Collection[Entry] = (),
        copy: bool = True,
    ) -> np.ndarray | None:
        """Decode ``tokens`` at ``pos0..`` into ``seq``, evicting cache when the pool is full.

        With ``want_logits`` the last token's logits row is returned as a copy, or, with
        ``copy=False``, left in the context for the caller to sample in place (``None`` returned).
        Raises :class:`CapacityError` when nothing is left to evict (the chunks decoded before
        stay in the sequence).
        """
        step = self.ctx.n_batch
        for off in range(0, len(tokens), step):
            chunk = tokens[off : off + step]
            last = off + step >= len(tokens)
            self.decode_batch([(seq, t, pos0 + off + i) for i, t in enumerate(chunk)], want_logits and last, protect)
        return self.ctx.last_logits() if want_logits and copy and tokens else None

    def decode_batch(
        self, batch: Sequence[tuple[int, int, int]], want_logits: bool, protect: Collection[Entry] = ()
    ) -> None:
        """One ``llama_decode`` call, retried after evicting cache while the pool is full."""
        while True:
            rc = self.ctx.decode(batch, want_logits)
            if rc == 0:
                return
            if rc != 1:
                raise RuntimeError(f"llama_decode failed (return code {rc})")
            if not self.make_room(protect):
                raise CapacityError(f"the KV pool ({self.ctx.n_ctx} cells) is full of live sessions")

    def extend(self, entry: Entry, tokens: Sequence[int], want_logits: bool, copy: bool = True) -> np.ndarray | None:
        """Append ``tokens`` to ``entry`` (its description follows each decoded chunk); logits as :meth:`decode`."""
        logits = None
        step = self.ctx.n_batch
        for off in range(0, len(tokens), step):
            chunk = list(tokens[off : off + step])
            last = off + step >= len(tokens)
            logits = self.decode(entry.seq, chunk, entry.cached, want_logits and last, (entry,), copy)
            entry.append(chunk)
        return logits
