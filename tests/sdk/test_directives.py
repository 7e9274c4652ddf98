"""The directive algebra against a naive right-to-left list splice."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from leyline_sdk.core.directives import (
    Directive,
    Mode,
    apply,
    check,
    digest,
    first_forget_start,
    kept_runs,
    position_map,
    truncate_result,
)
from leyline_sdk.core.errors import DirectiveError

tokens = st.integers(min_value=0, max_value=50_000)


@st.composite
def base_and_directives(draw):
    base = draw(st.lists(tokens, max_size=60))
    k = draw(st.integers(min_value=0, max_value=5))
    cuts = sorted(draw(st.lists(st.integers(0, len(base)), min_size=2 * k, max_size=2 * k)))
    directives = [
        Directive(
            start=cuts[2 * i],
            end=cuts[2 * i + 1],
            replacement=draw(st.lists(tokens, max_size=8)),
            mode=draw(st.sampled_from(list(Mode))),
        )
        for i in range(k)
    ]
    return base, directives


def naive_splice(base, directives):
    out = list(base)
    for d in reversed(directives):
        out[d.start : d.end] = list(d.replacement)
    return out


@given(base_and_directives())
def test_apply_equals_naive_splice(case):
    base, directives = case
    assert apply(base, directives) == naive_splice(base, directives)


@given(base_and_directives())
def test_position_map_points_at_the_same_tokens(case):
    base, directives = case
    new = apply(base, directives)
    pm = position_map(len(base), directives)
    kept = [p for p in range(len(base)) if pm[p] is not None]
    assert len(base) - len(kept) == sum(d.end - d.start for d in directives)
    for p in kept:
        assert new[pm[p]] == base[p]
    new_positions = [pm[p] for p in kept]
    assert new_positions == sorted(set(new_positions))
    # downstream of everything, the shift is the sum of deltas
    if directives and directives[-1].end < len(base):
        assert pm[len(base) - 1] == len(base) - 1 + sum(d.delta for d in directives)


@given(base_and_directives())
def test_kept_runs_cover_exactly_the_surviving_tokens(case):
    base, directives = case
    runs = kept_runs(len(base), directives)
    covered = sum(r.old_end - r.old_start for r in runs)
    assert covered == len(base) - sum(d.end - d.start for d in directives)
    for r in runs:
        assert r.old_end > r.old_start


@given(base_and_directives(), st.integers(0, 80))
def test_truncate_result_keeps_exactly_the_first_tokens(case, length):
    base, directives = case
    cut = truncate_result(len(base), directives, length)
    assert apply(base, cut) == naive_splice(base, directives)[:length]
    if length >= len(apply(base, directives)):
        assert cut == directives
    elif cut != directives[: len(cut)]:  # those before the cut as they were, then one forget to the end
        assert cut[:-1] == directives[: len(cut) - 1]
        assert cut[-1].mode is Mode.FORGET and cut[-1].end == len(base)


def test_identity_directive_changes_nothing():
    base = [5, 6, 7, 8]
    d = Directive(start=1, end=3, replacement=[6, 7])
    assert d.delta == 0
    assert apply(base, [d]) == base
    assert position_map(4, [d]) == [0, None, None, 3]


def test_insertion_and_deletion():
    assert apply([1, 2, 3], [Directive(start=1, end=1, replacement=[9])]) == [1, 9, 2, 3]
    assert apply([1, 2, 3], [Directive(start=0, end=2)]) == [3]
    assert apply([1, 2], [Directive(start=2, end=2, replacement=[7])]) == [1, 2, 7]


def test_first_forget_start():
    ds = [
        Directive(start=1, end=2),
        Directive(start=4, end=5, mode="forget"),
        Directive(start=6, end=7, mode="forget"),
    ]
    assert first_forget_start(ds) == 4
    assert first_forget_start(ds[:1]) is None


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"start": -1, "end": 2}, "start"),
        ({"start": 3, "end": 2}, "end"),
        ({"start": 0, "end": 1, "replacement": [-5]}, "replacement"),
        ({"start": 0, "end": 1, "replacement": [2**32]}, "replacement"),
        ({"start": 0, "end": 1, "mode": "erase"}, "mode"),
        ({"start": 0, "end": 1, "extra": 1}, "extra"),
        ({"start": "x", "end": 1}, "start"),
    ],
)
def test_malformed_directive_names_the_field(payload, field):
    with pytest.raises(ValidationError) as info:
        Directive.model_validate(payload)
    assert field in {str(loc) for err in info.value.errors() for loc in err["loc"]}


@pytest.mark.parametrize(
    "directives, base_length, index, field",
    [
        ([Directive(start=0, end=5)], 4, 0, "end"),
        ([Directive(start=2, end=3), Directive(start=0, end=1)], 10, 1, "start"),
        ([Directive(start=0, end=3), Directive(start=2, end=4)], 10, 1, "start"),
        (
            [Directive(start=0, end=1), Directive(start=1, end=2), Directive(start=9, end=11)],
            10,
            2,
            "end",
        ),
    ],
)
def test_check_names_the_offending_directive(directives, base_length, index, field):
    with pytest.raises(DirectiveError) as info:
        check(directives, base_length)
    assert info.value.index == index
    assert info.value.field == field
    assert f"directive {index}" in str(info.value)
    with pytest.raises(DirectiveError):
        apply([0] * base_length, directives)


def test_wire_form_round_trips():
    d = Directive(start=100, end=400, replacement=[1, 2], mode="forget")
    wire = d.model_dump(mode="json")
    assert wire == {"start": 100, "end": 400, "replacement": [1, 2], "mode": "forget"}
    assert Directive.model_validate(wire) == d


def test_digest_is_stable_and_sensitive():
    # Fixed value: the digest must not change across processes, machines or releases.
    assert digest([1, 2, 3]) == "sha256:4636993d3e1da4e9d6b8f87b79e8f7c6"
    big = list(range(200_000))  # spans several internal chunks
    assert digest(big) == "sha256:" + hashlib.sha256(struct.pack(f"<{len(big)}I", *big)).hexdigest()[:32]
    assert digest([1, 2, 3]) == digest((1, 2, 3))
    assert digest([1, 2, 3]) != digest([1, 2, 4])
    assert digest([]) != digest([0])
    with pytest.raises(ValueError):
        digest([-1])


def test_repair_and_block_appear_on_the_wire_only_when_used():
    d = Directive(start=5, end=5, replacement=[7], repair=2, block="blk_x")
    wire = d.model_dump(mode="json")
    assert wire == {"start": 5, "end": 5, "replacement": [7], "mode": "amortize", "repair": 2, "block": "blk_x"}
    assert Directive.model_validate(wire) == d
    with pytest.raises(ValidationError):
        Directive(start=0, end=0, repair=-1)
