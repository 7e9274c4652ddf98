"""The splice plan: a pure function from (base, directives, cached) to what an engine must do.

Index layout of an amortize splice (old = the session's base, new = ``apply(base, D)``)::

    old:  | keep          | S_1 | run_1         | S_2 | run_2      | ... | (cut) uncached/forget tail |
    new:  | keep (same)   | R_1 | run_1 moved   | R_2 | run_2 moved| ... | tail, prefilled            |
            shared KV       fill  copy+rotate    fill  copy+rotate          fill

* ``keep`` — the leading base tokens whose KV stays where it is (the shared radix path);
* ``moves`` — every other surviving run below the cut, copied into fresh storage at its new
  position and rotated by its shift (copy-on-write: the old branch may still serve others);
* ``fills`` — each replacement ``R_i``, computed at its new positions after everything left of
  it, in order (moves first: a rotation does not depend on any replacement);
* ``cut`` — the first ``forget`` start, or the end of what is cached, never inside a directive:
  everything from there (``tail``) is prefilled;
* ``exact`` — new positions ``[0, exact)`` hold exact KV afterwards; from the first moved token
  on, KV is approximate (it kept the removed span's notes).

Nothing here touches an engine; :mod:`leyline_server.splice.execute` walks a plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leyline_sdk.directives import Directive, KeptRun, Mode, apply, kept_runs

__all__ = ["Fill", "SplicePlan", "plan_splice"]


@dataclass(frozen=True)
class Fill:
    """Tokens to compute at new positions ``[at, at + len(tokens))``."""

    at: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class SplicePlan:
    """What an engine must do to turn a cached base into ``tokens``; see the module docstring."""

    tokens: tuple[int, ...]
    keep: int
    moves: tuple[KeptRun, ...]
    fills: tuple[Fill, ...]
    cut: int
    exact: int

    @property
    def tail(self) -> tuple[int, ...]:
        """The tokens prefilled from the cut on."""
        return self.tokens[self.cut :]

    @property
    def rotated_tokens(self) -> int:
        """Tokens whose KV is moved (copied and rotated by their shift)."""
        return sum(run.old_end - run.old_start for run in self.moves)

    @property
    def filled_tokens(self) -> int:
        """Tokens computed by the plan (replacements and tail)."""
        return sum(len(f.tokens) for f in self.fills) + len(self.tail)

    @property
    def is_reprefill(self) -> bool:
        """Nothing is moved or filled in the middle: a prefix-trimmed re-prefill does the same."""
        return not self.moves and not self.fills

    def moved_positions(self) -> tuple[list[int], list[int]]:
        """(old positions, new positions) of every moved token, in plan order."""
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


def plan_splice(
    base: Sequence[int], directives: Sequence[Directive], cached: int, exact: int | None = None
) -> SplicePlan:
    """Plan ``directives`` on a base whose first ``cached`` tokens hold KV (``exact`` of them exact).

    Raises :class:`~leyline_sdk.errors.DirectiveError` when the directives do not apply to the base.
    """
    if not 0 <= cached <= len(base):
        raise ValueError(f"cached={cached} must lie in [0, {len(base)}]")
    exact = cached if exact is None else min(exact, cached)
    tokens = tuple(apply(base, directives))
    limit = _cut(directives, cached)
    spliced = [d for d in directives if d.start < limit]
    runs = kept_runs(limit, spliced)
    new_cut = limit + sum(d.delta for d in spliced)
    keep = runs[0].old_end if runs and runs[0].old_start == 0 and runs[0].shift == 0 else 0
    moves = tuple(run for run in runs if not (run.old_start == 0 and run.shift == 0))
    fills: list[Fill] = []
    shift = 0
    for d in spliced:
        if d.replacement:
            fills.append(Fill(d.start + shift, tuple(d.replacement)))
        shift += d.delta
    if exact < keep:
        new_exact = exact
    else:
        new_exact = moves[0].new_start if moves else len(tokens)
    return SplicePlan(tokens, keep, moves, tuple(fills), new_cut, new_exact)
