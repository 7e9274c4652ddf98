"""``plan_splice`` on its own (no engine): replaying a plan on token lists reproduces ``apply``."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from leyline_sdk.core.directives import Directive, apply
from leyline_server.splice.plan import Fill, plan_splice

token = st.integers(min_value=0, max_value=50)


@st.composite
def cases(draw):
    base = draw(st.lists(token, min_size=0, max_size=40))
    k = draw(st.integers(0, 4))
    cuts = sorted(draw(st.lists(st.integers(0, len(base)), min_size=2 * k, max_size=2 * k)))
    directives = [
        Directive(
            start=cuts[2 * i],
            end=cuts[2 * i + 1],
            replacement=draw(st.lists(token, max_size=4)),
            mode=draw(st.sampled_from(["amortize", "amortize", "forget"])),
            repair=draw(st.sampled_from([0, 0, 1, 3])),
            block=draw(st.sampled_from([None, None, f"blk{i}"])),
        )
        for i in range(k)
    ]
    cached = draw(st.integers(0, len(base)))
    exact = draw(st.integers(0, cached))
    return base, directives, cached, exact


def replay(base, plan):
    """What an engine builds: [(token, source)] per new position; source is where its KV comes from."""
    new = [None] * len(plan.tokens)
    for p in range(plan.keep):
        new[p] = (base[p], ("kept", p))
    for run in plan.moves:
        for i in range(run.old_end - run.old_start):
            assert new[run.new_start + i] is None, "two writers for one position"
            new[run.new_start + i] = (base[run.old_start + i], ("moved", run.old_start + i))
    for step in plan.steps:
        if isinstance(step, Fill):
            assert all(new[p] is not None for p in range(step.at)), "a fill over a hole"
            for i, t in enumerate(step.tokens):
                new[step.at + i] = (t, ("filled", step.at + i))
        else:  # a block's KV relocated: its own tokens, nothing attended to
            for i, t in enumerate(step.tokens):
                new[step.at + i] = (t, ("placed", (step.block, step.start + i)))
    assert all(x is not None for x in new), "a position nothing wrote"
    return new


@settings(max_examples=400, deadline=None)
@given(cases())
def test_replaying_a_plan_gives_apply(case):
    base, directives, cached, exact = case
    plan = plan_splice(base, directives, cached, exact)
    built = replay(base, plan)
    assert [t for t, _ in built] == apply(base, directives)
    # only cached KV is reused, and moved tokens keep their token and relative order
    for _, (kind, where) in built:
        if kind in ("kept", "moved"):
            assert isinstance(where, int) and where < cached
        if kind == "placed":  # only directives naming a block place anything
            assert any(d.block == where[0] for d in directives)
    forget = [d.start for d in directives if d.mode == "forget"]
    if forget:  # nothing from the first forget start on is reused
        assert all(where < min(forget) for _, (kind, where) in built if kind in ("kept", "moved"))
        assert not plan.places or min(p.at for p in plan.places) < plan.cut
    assert plan.rotated_tokens == sum(1 for _, (kind, _) in built if kind in ("moved", "placed"))
    assert len(set(id(s) for s in plan.steps)) == len(plan.steps)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_exact_marks_where_approximate_kv_starts(case):
    base, directives, cached, exact = case
    plan = plan_splice(base, directives, cached, exact)
    built = replay(base, plan)
    first_moved = next((p for p, (_, (kind, _)) in enumerate(built) if kind in ("moved", "placed")), len(built))
    if exact < plan.keep:  # the base was approximate inside the kept prefix already
        assert plan.exact == exact
    else:
        assert plan.exact == first_moved
    for p in range(plan.exact):  # everything before it is exact: kept exact KV or computed after exact KV
        kind, where = built[p][1]
        assert kind == "filled" or (kind == "kept" and where < exact)


def test_a_plain_stub_edit():
    base = list(range(100, 130))
    plan = plan_splice(base, [Directive(start=10, end=20, replacement=[1, 2])], cached=29)
    assert plan.keep == 10 and plan.fills[0].at == 10 and plan.fills[0].tokens == (1, 2)
    assert [(r.old_start, r.old_end, r.new_start) for r in plan.moves] == [(20, 29, 12)]
    assert plan.cut == 21 and plan.tail == (129,) and plan.exact == 12 and plan.rotated_tokens == 9
    assert plan.fills[-1] == Fill(21, (129,))  # the uncached last token is computed last


def test_seam_repair_recomputes_the_first_tokens_after_the_replacement():
    base = list(range(100, 130))
    plan = plan_splice(base, [Directive(start=10, end=20, replacement=[1, 2], repair=3)], cached=29)
    assert [(f.at, f.tokens) for f in plan.fills] == [(10, (1, 2)), (12, (120, 121, 122)), (21, (129,))]
    assert [(r.old_start, r.old_end, r.new_start) for r in plan.moves] == [(23, 29, 15)]
    assert plan.exact == 15 and plan.rotated_tokens == 6


def test_a_block_is_placed_and_its_seams_repaired():
    base = list(range(100, 130))
    block = Directive(start=30, end=30, replacement=[5, 6, 7, 8, 9], block="b", repair=2)  # appended
    plan = plan_splice(base, [block], cached=29)
    assert plan.keep == 29 and not plan.moves
    # the uncached base token, the block's first tokens (recomputed), the rest of the block (placed)
    assert [(f.at, f.tokens) for f in plan.fills] == [(29, (129,)), (30, (5, 6))]
    assert [(p.at, p.block, p.start, p.end) for p in plan.places] == [(32, "b", 2, 5)]
    assert plan.exact == 32 and plan.tokens[-6:] == (129, 5, 6, 7, 8, 9)
