"""The pieces of an in-place splice on one llama.cpp sequence (see :mod:`.engine`).

* :func:`prepare` — drop every base cell the plan does not keep, move the kept runs;
* :func:`land` — put moved cells that were lifted out of the pool back, at their new positions;
* :func:`move_block` — a copy of another entry's cells (a block), moved to where it lands.

Moving goes through a :class:`~.shift.KeyShifter` when the engine has one: the moving cells are
serialised, removed from the pool and repositioned in host memory (new positions, keys rotated),
and restored (:func:`land`) only when something needs them: a fill past them, the canary's
read-back, the commit. Until then they are out of the pool, so fills and the canary's reference
decode attend over a short pool (llama.cpp's attention reads every cell up to the highest one in
use). Without a shifter, runs move with ``llama_memory_seq_add``, which changes positions at once
but re-rotates keys lazily, at the start of the next ``llama_decode``, for every cell of the
pool; every path that moves cells that way decodes before anything reads keys (the fills do,
and so does the canary's reference decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from leyline_sdk.core.directives import KeptRun
from leyline_server.contract.values import CapacityError, Handle
from leyline_server.engines.llamacpp.cache import Entry, SequenceCache
from leyline_server.engines.llamacpp.shift import KeyShifter
from leyline_server.engines.llamacpp.state import StateBlob

__all__ = ["Stage", "prepare", "land", "move_block"]

PARKED = 1 << 30  # runs are parked this far out while moving, so that no two ranges ever overlap


@dataclass
class Stage:
    """A splice in progress on ``entry`` (the handle's own sequence, or a new one for an empty handle)."""

    handle: Handle
    entry: Entry
    keep: int
    owned: bool = False
    shifter: KeyShifter | None = None  # None: runs move with seq_add
    scratch: int = 1  # the sequence id lifted cells pass through
    prepared: bool = False
    held: bool = True  # ``entry.busy`` counts this stage until commit or abort
    pending: StateBlob | None = None  # moved cells lifted out of the pool, repositioned, not yet landed
    pending_from: int = 0  # the lowest new position among them
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
    forgotten or uncached tail). Shifted runs are lifted out and repositioned (:func:`_lift`),
    or, without a shifter, parked at ``PARKED + old`` and brought to ``old + shift`` with
    ``seq_add`` (no range then ever holds cells of another run).
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
    stage.prepared = True  # the sequence no longer matches its description: abort cuts it to keep
    moving = [run for run in ordered if run.shift]
    if moving and not (stage.shifter is not None and _lift(cache, stage, moving)):
        for run in moving:
            ctx.seq_add(seq, run.old_start, run.old_end, PARKED)
        for run in moving:
            ctx.seq_add(seq, PARKED + run.old_start, PARKED + run.old_end, run.shift - PARKED)
    old = stage.entry.rotations
    for run in ordered:
        stage.set_rotations(run.new_start, old[run.old_start : run.old_end] + (1 if run.shift else 0))


def _lift(cache: SequenceCache, stage: Stage, moving: list[KeptRun]) -> bool:
    """Serialise the ``moving`` runs' cells, remove them from the pool, reposition them in host
    memory (:attr:`Stage.pending`); ``False`` (nothing changed) when the state cannot be read."""
    assert stage.shifter is not None
    ctx, seq, scratch = cache.ctx, stage.entry.seq, stage.scratch
    ctx.seq_rm(scratch)
    for run in moving:
        ctx.seq_cp(seq, scratch, run.old_start, run.old_end)
    size = ctx.state_size(scratch)
    data = ctx.state_get(scratch, cache.lift_buffer(size), size)
    ctx.seq_rm(scratch)
    try:
        state = StateBlob.parse(data)
    except ValueError:
        return False
    for run in moving:
        ctx.seq_rm(seq, run.old_start, run.old_end)
    starts = np.asarray([run.old_start for run in moving])
    shifts = np.asarray([run.shift for run in moving])
    stage.shifter.shift(state, shifts[np.searchsorted(starts, state.positions, side="right") - 1])
    stage.pending, stage.pending_from = state, min(run.new_start for run in moving)
    return True


def land(cache: SequenceCache, stage: Stage) -> None:
    """Restore lifted cells into fresh cells of the stage's sequence (making room if needed).

    Raises :class:`CapacityError` when the pool cannot take them back (the cells are lost: the
    caller cuts the sequence back to ``keep``, as an abort does).
    """
    state = stage.pending
    if state is None:
        return
    ctx, scratch = cache.ctx, stage.scratch
    while not ctx.state_set(state.data, scratch):
        if not cache.make_room((stage.entry,)):
            raise CapacityError(f"no room in the KV pool for {state.cells} moved cells")
    ctx.seq_cp(scratch, stage.entry.seq)
    ctx.seq_rm(scratch)
    stage.pending = None


def move_block(cache: SequenceCache, stage: Stage, source: Entry, run: KeptRun, scratch: int) -> None:
    """Place a copy of ``source``'s cells ``[old_start, old_end)`` at ``new_start`` of the stage."""
    ctx = cache.ctx
    n = run.old_end - run.old_start
    if source.resident:
        cache.copy_cells(source.seq, run.old_start, run.old_end, scratch, protect=(source, stage.entry))
    else:  # a parked block: its serialised cells go straight into the scratch sequence
        cache.restore_range(source, scratch, run.old_start, run.old_end, protect=(stage.entry,))
    if run.shift and not _reposition(cache, stage, scratch, run.shift):
        ctx.seq_add(scratch, run.old_start, run.old_end, run.shift)
    ctx.seq_cp(scratch, stage.entry.seq, run.new_start, run.new_start + n)
    ctx.seq_rm(scratch)
    counts = source.rotations[run.old_start : run.old_end] + (1 if run.shift else 0)
    stage.set_rotations(run.new_start, counts)


def _reposition(cache: SequenceCache, stage: Stage, scratch: int, shift: int) -> bool:
    """Move every cell of ``scratch`` by ``shift`` through the shifter; ``False`` without one."""
    if stage.shifter is None:
        return False
    ctx = cache.ctx
    data = ctx.state_get(scratch)
    try:
        state = StateBlob.parse(data)
    except ValueError:
        return False
    stage.shifter.shift(state, np.full(state.cells, shift))
    ctx.seq_rm(scratch)
    while not ctx.state_set(data, scratch):
        if not cache.make_room((stage.entry,)):
            raise CapacityError(f"no room to place {state.cells} KV cells")
    return True
