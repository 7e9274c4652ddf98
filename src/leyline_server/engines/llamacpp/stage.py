"""The pieces of an in-place splice on one llama.cpp sequence (see :mod:`.engine`).

* :func:`prepare` — drop every base cell the plan does not keep, move the kept runs;
* :func:`move_block` — a copy of another entry's cells (a block), moved to where it lands;
* :func:`canary_keys` — rotated layer-0 keys read back, and the model's own for the same tokens.

Moving uses ``llama_memory_seq_add``, which changes positions at once but re-rotates keys
lazily, at the start of the next ``llama_decode`` (for every moved cell of the pool). Every path
that moves cells decodes afterwards before anything reads keys: the fills do, and the canary's
reference decode does (a splice that only deletes has no fill, but it has a canary, since it
moves runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from leyline_sdk.directives import KeptRun
from leyline_server.engines.base import Handle
from leyline_server.engines.llamacpp.cache import Entry, SequenceCache
from leyline_server.engines.llamacpp.lib import layer0_keys

__all__ = ["Stage", "prepare", "move_block", "canary_keys"]

PARKED = 1 << 30  # runs are parked this far out while moving, so that no two ranges ever overlap


@dataclass
class Stage:
    """A splice in progress on ``entry`` (the handle's own sequence, or a new one for an empty handle)."""

    handle: Handle
    entry: Entry
    keep: int
    owned: bool = False
    prepared: bool = False
    held: bool = True  # ``entry.busy`` counts this stage until commit or abort
    _rotations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))

    def __post_init__(self) -> None:
        self._rotations = self.entry.rotations[: self.keep].astype(np.int32).copy()
        self.entry.busy += 1

    def unhold(self) -> None:
        """The splice is over: the entry may be parked again (once, whatever path ends the stage)."""
        if self.held:
            self.entry.busy -= 1
            self.held = False

    def set_rotations(self, at: int, values: np.ndarray) -> None:
        """Record the rotation counts of new positions ``[at, at + len(values))``."""
        end = at + len(values)
        if end > len(self._rotations):
            self._rotations = np.concatenate([self._rotations, np.zeros(end - len(self._rotations), dtype=np.int32)])
        self._rotations[at:end] = values

    def rotations(self, n: int) -> np.ndarray:
        """Rotation counts of new positions ``[0, n)``."""
        self.set_rotations(n, np.zeros(0, dtype=np.int32))
        return self._rotations[:n]


def prepare(cache: SequenceCache, stage: Stage, runs: Sequence[KeptRun]) -> None:
    """Once per splice: remove what the plan drops from the stage's sequence and move ``runs``.

    Kept are ``[0, keep)`` and each run's old range; everything else goes (replaced spans, the
    forgotten or uncached tail). Runs with a shift are first parked at ``PARKED + old`` and then
    brought to ``old + shift``: no ``seq_add`` range ever holds cells of another run.
    """
    if stage.prepared:
        if runs:
            raise AssertionError("moves must come before every other step")
        return
    ctx, seq = cache.ctx, stage.entry.seq
    ordered = sorted(runs, key=lambda r: r.old_start)
    end = stage.keep
    for run in ordered:
        if run.old_start > end:
            ctx.seq_rm(seq, end, run.old_start)
        end = run.old_end
    ctx.seq_rm(seq, end, -1)
    moving = [run for run in ordered if run.shift]
    for run in moving:
        ctx.seq_add(seq, run.old_start, run.old_end, PARKED)
    for run in moving:
        ctx.seq_add(seq, PARKED + run.old_start, PARKED + run.old_end, run.shift - PARKED)
    old = stage.entry.rotations
    for run in ordered:
        stage.set_rotations(run.new_start, old[run.old_start : run.old_end] + (1 if run.shift else 0))
    stage.prepared = True


def move_block(cache: SequenceCache, stage: Stage, source: Entry, run: KeptRun, scratch: int) -> None:
    """Place a copy of ``source``'s cells ``[old_start, old_end)`` at ``new_start`` of the stage."""
    ctx = cache.ctx
    n = run.old_end - run.old_start
    if source.resident:
        cache.copy_cells(source.seq, run.old_start, run.old_end, scratch, protect=(source, stage.entry))
    else:  # a parked block: its serialised cells go straight into the scratch sequence
        cache.restore_range(source, scratch, run.old_start, run.old_end, protect=(stage.entry,))
    if run.shift:
        ctx.seq_add(scratch, run.old_start, run.old_end, run.shift)
    ctx.seq_cp(scratch, stage.entry.seq, run.new_start, run.new_start + n)
    ctx.seq_rm(scratch)
    counts = source.rotations[run.old_start : run.old_end] + (1 if run.shift else 0)
    stage.set_rotations(run.new_start, counts)


def canary_keys(
    cache: SequenceCache,
    seq: int,
    positions: Sequence[int],
    tokens: Sequence[int],
    scratch: int,
    references: Sequence[int],
) -> tuple[np.ndarray, np.ndarray] | None:
    """(staged layer-0 keys at ``positions``, the model's own keys of ``tokens`` there), or ``None``.

    The reference decodes each token alone in an empty sequence at its position (empty
    sequences accept any start) — which also applies pending re-rotations before the read.
    ``None`` when the state format cannot be read (the canary is then unavailable).
    """
    ctx = cache.ctx
    pairs = list(zip(positions, tokens, strict=True))[: len(references)]
    try:
        for ref in references:
            ctx.seq_rm(ref)
        cache.decode_batch([(references[i], t, p) for i, (p, t) in enumerate(pairs)], want_logits=False)
        expected = np.stack([layer0_keys(ctx.state_get(references[i]))[1][0] for i in range(len(pairs))])
        ctx.seq_rm(scratch)
        for p, _ in pairs:
            ctx.seq_cp(seq, scratch, p, p + 1)
        cell_pos, rows = layer0_keys(ctx.state_get(scratch))
        by_pos = {int(p): rows[i] for i, p in enumerate(cell_pos)}
        if any(p not in by_pos for p, _ in pairs):
            return None
        actual = np.stack([by_pos[p] for p, _ in pairs])
    except ValueError:
        return None
    finally:
        ctx.seq_rm(scratch)
        for ref in references:
            ctx.seq_rm(ref)
    return actual, expected
