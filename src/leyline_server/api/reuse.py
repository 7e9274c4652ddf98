"""A new conversation that differs from a cached one in a few short spans: reuse the rest by a splice.

Two conversations of one key often share a long prompt that differs only inside a line: a working
directory or a date in the system prompt, a session id in a header line, then thousands of
identical tokens (the rest of the system prompt, the tools). The prefix cache reuses only what
comes before the first difference. Under the client-edit opt-in (``X-Leyline-Client-Edits:
amortize``) a request that continues no conversation of its key may instead open its new session
on another session's *exact* cached tokens and splice the differing spans in ``amortize`` mode:
each span's replacement is prefilled, the identical run after it is moved into place by the
RoPE δ-rotation, and what follows the last run is prefilled as usual.

The rows moved this way were computed next to the other conversation's span, so the new
session's KV is approximate (reported as ``rotated_tokens`` / ``approximate_tokens``, with the
source ``conversation``); a request without the opt-in never gets it (conversation rule 4 in
:mod:`leyline_server.api.conversations`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.explain.diff import common_prefix_length

__all__ = ["Reuse", "best_reuse", "plan_reuse", "MAX_SPAN", "MIN_RUN", "MAX_EDITS"]

MAX_SPAN = 64  # tokens: the longest differing span, on either side, that is spliced
MIN_RUN = 64  # tokens: the shortest identical run after a span that is worth moving
MAX_EDITS = 4  # spans per request
ANCHOR = 8  # tokens that must match where a run resumes


@dataclass(frozen=True)
class Reuse:
    """Open the new session on ``base`` (exact cached tokens of another session), then splice
    ``directives``: ``apply(base, directives)`` is a prefix of the prompt. ``moved`` tokens are
    rotated into place instead of being prefilled."""

    base: tuple[int, ...]
    directives: tuple[Directive, ...]
    moved: int

    @property
    def reused(self) -> int:
        """Prompt tokens that come from ``base`` (the common prefix plus the moved runs)."""
        return len(self.base) - sum(d.end - d.start for d in self.directives)


def _resume(
    cached: Sequence[int], i: int, prompt: Sequence[int], j: int, room: tuple[int, int]
) -> tuple[int, int] | None:
    """Where an identical stretch may resume after ``cached[i]`` / ``prompt[j]`` differ: skip ``a``
    cached and ``b`` prompt tokens (at most ``room`` each; ``ANCHOR`` tokens match there), the
    shortest skip first; ``None`` if nothing matches within reach."""
    starts: dict[tuple[int, ...], list[int]] = {}
    for a in range(min(room[0], len(cached) - i - ANCHOR) + 1):
        starts.setdefault(tuple(cached[i + a : i + a + ANCHOR]), []).append(a)
    found = [
        (a, b)
        for b in range(min(room[1], len(prompt) - j - ANCHOR) + 1)
        for a in starts.get(tuple(prompt[j + b : j + b + ANCHOR]), ())
        if a or b
    ]
    return min(found, key=lambda ab: (ab[0] + ab[1], ab)) if found else None


def _span(
    cached: Sequence[int], i: int, prompt: Sequence[int], j: int, max_span: int, min_run: int
) -> tuple[int, int, int] | None:
    """The differing span at ``cached[i]`` / ``prompt[j]``: ``(a, b, run)`` — ``a`` cached tokens
    become ``b`` prompt tokens, then ``run`` >= ``min_run`` identical ones. Identical stretches
    shorter than ``min_run`` inside it (a path named twice in one paragraph) belong to the span."""
    a = b = 0
    while a <= max_span and b <= max_span:
        skip = _resume(cached, i + a, prompt, j + b, (max_span - a, max_span - b))
        if skip is None:
            return None
        a, b = a + skip[0], b + skip[1]
        run = common_prefix_length(cached[i + a :], prompt[j + b :])
        if run >= min_run:
            return a, b, run
        a, b = a + run, b + run
    return None


def plan_reuse(
    cached: Sequence[int],
    prompt: Sequence[int],
    max_span: int = MAX_SPAN,
    min_run: int = MIN_RUN,
    max_edits: int = MAX_EDITS,
) -> Reuse | None:
    """How ``prompt`` reuses ``cached`` beyond their common prefix (``None``: it does not).

    After the common prefix, each differing span of at most ``max_span`` tokens (on either side)
    followed by an identical run of at least ``min_run`` tokens becomes one ``amortize``
    directive, up to ``max_edits`` of them; the cached tokens after the last run are not kept.
    """
    i = j = common_prefix_length(cached, prompt)
    edits: list[Directive] = []
    moved = 0
    while len(edits) < max_edits and i < len(cached) and j < len(prompt):
        span = _span(cached, i, prompt, j, max_span, min_run)
        if span is None:
            break
        a, b, run = span
        edits.append(Directive(start=i, end=i + a, replacement=tuple(prompt[j : j + b]), mode=Mode.AMORTIZE))
        i, j, moved = i + a + run, j + b + run, moved + run
    if not edits:
        return None
    base = tuple(cached[:i])
    assert apply(base, edits) == list(prompt[:j])
    return Reuse(base, tuple(edits), moved)


def best_reuse(candidates: Iterable[Sequence[int]], prompt: Sequence[int]) -> Reuse | None:
    """The candidate (exact cached token paths) from which ``prompt`` reuses the most tokens."""
    best: Reuse | None = None
    for cached in candidates:
        reuse = plan_reuse(cached, prompt)
        if reuse is not None and (best is None or reuse.reused > best.reused):
            best = reuse
    return best
