"""The splice plan: a pure function from (base, directives, cached) to what an engine must do.

Index layout of an amortize splice (old = the session's base, new = ``apply(base, D)``)::

    old:  | keep          | S_1 | run_1         | S_2 | run_2      | ... | (cut) uncached/forget tail |
    new:  | keep (same)   | R_1 | run_1 moved   | R_2 | run_2 moved| ... | tail, prefilled            |
            shared KV       fill  copy+rotate    fill  copy+rotate          fill

* ``keep`` — the leading base tokens whose KV stays where it is (the shared radix path);
* ``moves`` — every other surviving run below the cut, copied into fresh storage at its new
  position and rotated by its shift (copy-on-write: the old branch may still serve others);
* ``steps`` — in order, each replacement ``R_i``: a :class:`Fill` (computed at its new positions
  after everything left of it) or, for a directive naming a precompiled block, a
  :class:`Place` (the block's KV relocated by rotation, nothing computed). Moves run first: a
  rotation does not depend on any replacement.
* **seam repair** — a directive with ``repair=k`` recomputes the first ``k`` tokens after its
  replacement (they are taken out of the following run and filled instead), and for a block,
  also the block's own first ``k`` tokens (they were computed without the new context);
* ``cut`` — the first ``forget`` start, or the end of what is cached, never inside a directive:
  everything from there (``tail``) is computed by the last steps, except blocks named by
  directives beyond the cache's end, which are still placed (never after a ``forget``);
* ``exact`` — new positions ``[0, exact)`` hold exact KV afterwards; from the first moved or
  placed token on, KV is approximate (it kept notes the fresh context would not give).

Nothing here touches an engine; :mod:`leyline_server.splice.execute` walks a plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leyline_sdk.core.directives import Directive, KeptRun, Mode, apply, kept_runs

__all__ = ["Fill", "Place", "SplicePlan", "plan_splice"]


@dataclass(frozen=True)
class Fill:
    """Tokens to compute at new positions ``[at, at + len(tokens))``."""

    at: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Place:
    """Block ``block``'s KV for its positions ``[start, end)``, relocated to ``[at, at + end - start)``."""

    at: int
    block: str
    start: int
    end: int
    tokens: tuple[int, ...]


Step = Fill | Place


@dataclass(frozen=True)
class SplicePlan:
    """What an engine must do to turn a cached base into ``tokens``; see the module docstring."""

    tokens: tuple[int, ...]
    keep: int
    moves: tuple[KeptRun, ...]
    steps: tuple[Step, ...]
    cut: int
    exact: int

    @property
    def tail(self) -> tuple[int, ...]:
        """The tokens from the cut on (computed by the last steps, blocks placed)."""
        return self.tokens[self.cut :]

    @property
    def fills(self) -> tuple[Fill, ...]:
        """The computed steps."""
        return tuple(s for s in self.steps if isinstance(s, Fill))

    @property
    def places(self) -> tuple[Place, ...]:
        """The relocated block steps."""
        return tuple(s for s in self.steps if isinstance(s, Place))

    @property
    def rotated_tokens(self) -> int:
        """Tokens whose KV is moved or placed (copied and rotated by their shift)."""
        return sum(r.old_end - r.old_start for r in self.moves) + sum(p.end - p.start for p in self.places)

    @property
    def filled_tokens(self) -> int:
        """Tokens computed by the plan (replacements, repairs and the tail)."""
        return sum(len(f.tokens) for f in self.fills)

    @property
    def is_reprefill(self) -> bool:
        """Nothing is moved or placed: a prefix-trimmed re-prefill computes the same."""
        return not self.moves and not self.places

    def moved_positions(self) -> tuple[list[int], list[int]]:
        """(old positions, new positions) of every moved base token, in plan order."""
        old: list[int] = []
        new: list[int] = []
        for run in self.moves:
            old.extend(range(run.old_start, run.old_end))
            new.extend(range(run.new_start, run.new_start + run.old_end - run.old_start))
        return old, new


def _cut(directives: Sequence[Directive], cached: int) -> int:
    limit = min([cached] + [d.start for d in directives if d.mode is Mode.FORGET])
    for d in directives:  # never cut through a directive
        if d.start < limit < d.end:
            limit = d.start
    return limit


def _steps_for(d: Directive, at: int, base: Sequence[int], run: KeptRun | None) -> tuple[list[Step], int]:
    """The steps of one directive landing at ``at``; how many tokens of the next ``run`` it repairs."""
    steps: list[Step] = []
    r, k = tuple(d.replacement), d.repair
    if d.block is not None and r:
        head = min(k, len(r))
        if head:
            steps.append(Fill(at, r[:head]))
        if head < len(r):
            steps.append(Place(at + head, d.block, head, len(r), r[head:]))
    elif r:
        steps.append(Fill(at, r))
    follows = run is not None and run.old_start == d.end and run.new_start == at + len(r)
    taken = min(k, run.old_end - run.old_start) if run is not None and follows else 0
    if taken:
        steps.append(Fill(at + len(r), tuple(base[d.end : d.end + taken])))
    return steps, taken


def _tail_steps(
    tokens: Sequence[int], rest: Sequence[Directive], start: int, shift: int, place_blocks: bool
) -> tuple[list[Step], int]:
    """Steps that compute the tail ``tokens[start:]``: prefilled, except blocks placed (no forget)."""
    steps: list[Step] = []
    pos = start
    for d in rest:
        at = d.start + shift
        shift += d.delta
        if not (place_blocks and d.block is not None and d.replacement):
            continue
        if at > pos:
            steps.append(Fill(pos, tuple(tokens[pos:at])))
        block_steps, _ = _steps_for(d, at, (), None)
        steps.extend(block_steps)
        pos = at + len(d.replacement)
    if pos < len(tokens):
        steps.append(Fill(pos, tuple(tokens[pos:])))
    return steps, shift


def plan_splice(
    base: Sequence[int], directives: Sequence[Directive], cached: int, exact: int | None = None
) -> SplicePlan:
    """Plan ``directives`` on a base whose first ``cached`` tokens hold KV (``exact`` of them exact).

    Raises :class:`~leyline_sdk.core.errors.DirectiveError` when the directives do not apply to the base.
    """
    if not 0 <= cached <= len(base):
        raise ValueError(f"cached={cached} must lie in [0, {len(base)}]")
    exact = cached if exact is None else min(exact, cached)
    tokens = tuple(apply(base, directives))
    limit = _cut(directives, cached)
    spliced = [d for d in directives if d.start < limit]
    runs = kept_runs(limit, spliced)
    keep = runs[0].old_end if runs and runs[0].old_start == 0 and runs[0].shift == 0 else 0
    moves = [run for run in runs if not (run.old_start == 0 and run.shift == 0)]
    steps: list[Step] = []
    shift = 0
    for d in spliced:
        follower = next((i for i, run in enumerate(moves) if run.old_start == d.end), None)
        new_steps, taken = _steps_for(d, d.start + shift, base, moves[follower] if follower is not None else None)
        steps.extend(new_steps)
        if taken and follower is not None:
            run = moves[follower]
            trimmed = KeptRun(run.old_start + taken, run.old_end, run.new_start + taken)
            moves[follower : follower + 1] = [trimmed] if trimmed.old_start < trimmed.old_end else []
        shift += d.delta
    cut = limit + shift
    no_forget = all(d.mode is Mode.AMORTIZE for d in directives)
    tail, _ = _tail_steps(tokens, directives[len(spliced) :], cut, shift, no_forget)
    steps.extend(tail)
    approximate = [m.new_start for m in moves] + [s.at for s in steps if isinstance(s, Place)]
    new_exact = exact if exact < keep else min(approximate, default=len(tokens))
    return SplicePlan(tokens, keep, tuple(moves), tuple(steps), cut, new_exact)
