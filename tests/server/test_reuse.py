"""Conversation rule 4's plan: which cached tokens a new prompt reuses past a short differing span.

The oracle is the construction: a cached path ``P + X + R + T`` and a prompt ``P + Y + R + U`` with
the pieces drawn from disjoint token ranges, so the only right answer is known in advance (open on
``P + X + R``, replace ``X`` by ``Y``, move ``R``).
"""

from __future__ import annotations

import random

import pytest

from leyline_sdk.core.directives import Mode, apply
from leyline_server.api.reuse import MAX_SPAN, MIN_RUN, best_reuse, plan_reuse


def piece(rng: random.Random, n: int, low: int) -> list[int]:
    """``n`` tokens from ``[low, low + 1000)`` (each piece its own range: no accidental match)."""
    return [rng.randrange(low, low + 1000) for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_one_span_inside_a_line_is_found_exactly(seed):
    rng = random.Random(seed)
    p, r = piece(rng, rng.randrange(0, 200), 0), piece(rng, rng.randrange(MIN_RUN, 600), 1000)
    x, y = piece(rng, rng.randrange(0, MAX_SPAN + 1), 2000), piece(rng, rng.randrange(0, MAX_SPAN + 1), 3000)
    if not x and not y:
        y = [3000]
    cached, prompt = p + x + r + piece(rng, 50, 4000), p + y + r + piece(rng, 70, 5000)
    reuse = plan_reuse(cached, prompt)
    assert reuse is not None
    assert list(reuse.base) == p + x + r
    assert [(d.start, d.end, list(d.replacement), d.mode) for d in reuse.directives] == [
        (len(p), len(p) + len(x), y, Mode.AMORTIZE)
    ]
    assert reuse.moved == len(r) and reuse.reused == len(p) + len(r)
    assert apply(list(reuse.base), list(reuse.directives)) == prompt[: len(p) + len(y) + len(r)]


def test_several_spans_each_become_a_directive():
    rng = random.Random(7)
    p, r1, r2 = piece(rng, 30, 0), piece(rng, 100, 1000), piece(rng, 200, 6000)
    cached = p + [2000, 2001] + r1 + [2002] + r2 + [2003]
    prompt = p + [3000] + r1 + [3001, 3002, 3003] + r2 + [3004]
    reuse = plan_reuse(cached, prompt)
    assert reuse is not None and len(reuse.directives) == 2
    assert reuse.moved == 300
    assert apply(list(reuse.base), list(reuse.directives)) == prompt[:-1]


@pytest.mark.parametrize(
    ("span", "run", "found"),
    [(MAX_SPAN, MIN_RUN, True), (MAX_SPAN + 1, 500, False), (5, MIN_RUN - 1, False)],
)
def test_only_short_spans_before_long_runs_are_spliced(span, run, found):
    rng = random.Random(span + run)
    p, r = piece(rng, 40, 0), piece(rng, run, 1000)
    cached = p + piece(rng, span, 2000) + r + [9000]
    prompt = p + piece(rng, span, 3000) + r + [9001]
    assert (plan_reuse(cached, prompt) is not None) is found


def test_unrelated_or_extending_prompts_are_not_reuse():
    rng = random.Random(3)
    cached = piece(rng, 300, 0)
    assert plan_reuse(cached, piece(rng, 300, 1000)) is None  # nothing in common after the start
    assert plan_reuse(cached, cached + [5]) is None  # an extension: the prefix cache's job
    assert plan_reuse(cached, cached[:100]) is None


def test_the_candidate_reusing_most_wins():
    rng = random.Random(11)
    p, r = piece(rng, 20, 0), piece(rng, 400, 1000)
    near = p + [2000] + r + [2001]
    far = p + [2002] + r[:100] + [2003]
    prompt = p + [3000] + r + [3001]
    best = best_reuse([far, near], prompt)
    assert best is not None and list(best.base) == p + [2000] + r
    assert best_reuse([], prompt) is None


def test_a_path_named_twice_close_together_is_one_span():
    """Two short differences with a short identical stretch between them (fewer than MIN_RUN
    tokens) are one directive, not a refusal: the stretch is recomputed with them."""
    rng = random.Random(5)
    p, mid, r = piece(rng, 50, 0), piece(rng, 20, 1000), piece(rng, 300, 6000)
    cached = p + [2000, 2001] + mid + [2002] + r + [2003]
    prompt = p + [3000] + mid + [3001, 3002] + r + [3004]
    reuse = plan_reuse(cached, prompt)
    assert reuse is not None
    assert [(d.start, d.end, list(d.replacement)) for d in reuse.directives] == [(50, 73, [3000, *mid, 3001, 3002])]
    assert reuse.moved == 300
