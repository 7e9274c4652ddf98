"""rotate_copy: closure, inverse, Triton (interpreted) against torch, in place, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from leyline_server.kernels import rotate_copy, shift_cos_sin
from leyline_server.rope import PairLayout, RopeSpec


def make_spec(layout: PairLayout, offset: int = 8, width: int = 16) -> RopeSpec:
    return RopeSpec.plain(offset, width, layout)


def reference_rotation(row: torch.Tensor, angle: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """Float64 rotation of one [H, D] row by per-pair angles, written from the definition."""
    out = row.double().clone()
    lo, w = spec.rotary_offset, spec.rotary_dim
    for j in range(w // 2):
        a, b = (lo + 2 * j, lo + 2 * j + 1) if spec.layout is PairLayout.INTERLEAVED else (lo + j, lo + j + w // 2)
        c, s = math.cos(angle[j]), math.sin(angle[j])
        x1, x2 = row[:, a].double(), row[:, b].double()
        out[:, a] = x1 * c - x2 * s
        out[:, b] = x2 * c + x1 * s
    return out


@pytest.mark.parametrize("layout", list(PairLayout))
def test_matches_float64_definition(layout):
    spec = make_spec(layout)
    keys = torch.randn(2, 10, 3, 32)
    before = keys.clone()
    src, dst = torch.arange(0, 4), torch.arange(5, 9)
    old, new = torch.tensor([3, 900, 17, 2999]), torch.tensor([1, 100, 17, 3500])
    rotate_copy(keys, src, dst, old, new, spec)
    inv = torch.tensor(spec.inv_freq, dtype=torch.float32)
    for i in range(4):
        angle = ((new[i].float() * inv).double() - (old[i].float() * inv).double()).tolist()
        for layer in range(2):
            expected = reference_rotation(before[layer, src[i]], angle, spec)
            torch.testing.assert_close(keys[layer, dst[i]].double(), expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(keys[:, :5], before[:, :5])  # sources untouched


@pytest.mark.parametrize("layout", list(PairLayout))
def test_closure_and_inverse(layout):
    spec = make_spec(layout)
    keys = torch.randn(2, 4, 2, 32)
    original = keys.clone()
    slots = torch.arange(4)
    p0 = torch.tensor([10, 200, 1500, 2900])
    p1 = p0 + torch.tensor([-7, 300, -1200, 5])
    p2 = p1 + torch.tensor([40, -150, 9, -2000])
    two_steps = keys.clone()
    rotate_copy(two_steps, slots, slots, p0, p1, spec)
    rotate_copy(two_steps, slots, slots, p1, p2, spec)
    one_step = keys.clone()
    rotate_copy(one_step, slots, slots, p0, p2, spec)
    torch.testing.assert_close(two_steps, one_step, rtol=0, atol=5e-6)  # R(a)R(b) = R(a+b)
    rotate_copy(one_step, slots, slots, p2, p0, spec)
    torch.testing.assert_close(one_step, original, rtol=0, atol=5e-6)  # Δ then −Δ
    unchanged = keys.clone()
    rotate_copy(unchanged, slots, slots, p0, p0, spec)
    torch.testing.assert_close(unchanged, original, rtol=0, atol=0)  # Δ = 0 is exact


def test_shift_angle_uses_the_models_own_phases():
    spec = make_spec(PairLayout.HALF_SPLIT, width=64)
    old, new = torch.tensor([2047]), torch.tensor([3001])
    cos, _ = shift_cos_sin(old, new, spec)
    inv = torch.tensor(spec.inv_freq, dtype=torch.float32)
    exact = (new.float() * inv).double() - (old.float() * inv).double()
    torch.testing.assert_close(cos[0].double(), torch.cos(exact), rtol=0, atol=1e-7)


@pytest.mark.parametrize("layout", list(PairLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_equals_torch(layout, dtype):
    spec = make_spec(layout, offset=32, width=16)
    gen = torch.Generator().manual_seed(7)
    keys = torch.randn(3, 64, 1, 48, generator=gen).to(dtype)
    values = torch.randn(3, 64, 2, 8, generator=gen).to(dtype)
    src = torch.randperm(30, generator=gen)[:20]
    dst = 30 + torch.randperm(34, generator=gen)[:20]
    old = torch.randint(0, 4000, (20,), generator=gen)
    new = torch.randint(0, 4000, (20,), generator=gen)
    k_torch, v_torch = keys.clone(), values.clone()
    k_triton, v_triton = keys.clone(), values.clone()
    rotate_copy(k_torch, src, dst, old, new, spec, values=v_torch, backend="torch")
    rotate_copy(k_triton, src, dst, old, new, spec, values=v_triton, backend="triton")
    torch.testing.assert_close(v_triton, v_torch, rtol=0, atol=0)
    if dtype is torch.float32:
        torch.testing.assert_close(k_triton, k_torch, rtol=0, atol=2e-6)
    else:
        # the interpreter truncates instead of rounding on downcast: allow one ulp
        ulp = torch.finfo(dtype).eps * k_torch.float().abs().clamp_min(torch.finfo(dtype).tiny)
        assert ((k_triton.float() - k_torch.float()).abs() <= 2 * ulp + 1e-6).all()
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[dst] = False
    torch.testing.assert_close(k_triton[:, untouched], keys[:, untouched], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_in_place(backend):
    spec = make_spec(PairLayout.INTERLEAVED)
    keys = torch.randn(2, 16, 2, 32)
    expected = keys.clone()
    slots = torch.arange(3, 13)
    old, new = torch.arange(100, 110), torch.arange(40, 50)
    rotate_copy(expected, slots, slots + 0, old, new, spec, backend="torch")
    copy = keys.clone()
    rotate_copy(copy, slots, slots.clone(), old, new, spec, backend=backend)
    torch.testing.assert_close(copy, expected, rtol=0, atol=2e-6)


def _slots(kind: str, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) slot lists of one shape the CPU fast path tells apart (runs use slices)."""
    run_src, run_dst = torch.arange(3, 3 + n), torch.arange(n + 10, 2 * n + 10)
    scattered = torch.randperm(2 * n + 10, generator=gen)[: 2 * n]
    if kind == "runs":
        return run_src, run_dst
    if kind == "scattered":
        return scattered[:n], scattered[n:]
    if kind == "run_to_scattered":
        return run_src, (n + 10 + torch.randperm(n + 10, generator=gen))[:n]
    if kind == "in_place_run":
        return run_src, run_src.clone()
    return scattered[:n], scattered[:n].clone()  # in place, scattered


@pytest.mark.parametrize("kind", ["runs", "scattered", "run_to_scattered", "in_place_run", "in_place_scattered"])
@pytest.mark.parametrize("layout", list(PairLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("offset, width", [(8, 16), (0, 32)])
def test_cpu_fast_path_equals_the_torch_reference(kind, layout, dtype, offset, width):
    spec = make_spec(layout, offset=offset, width=width)
    gen = torch.Generator().manual_seed(11)
    n = 40
    keys = torch.randn(3, 2 * n + 20, 2, 32, generator=gen).to(dtype)
    values = torch.randn(3, 2 * n + 20, 2, 8, generator=gen).to(dtype)
    src, dst = _slots(kind, n, gen)
    old = torch.randint(0, 6000, (n,), generator=gen)
    new = torch.randint(0, 6000, (n,), generator=gen)
    k_ref, v_ref, k_fast, v_fast = keys.clone(), values.clone(), keys.clone(), values.clone()
    rotate_copy(k_ref, src, dst, old, new, spec, values=v_ref, backend="torch")
    rotate_copy(k_fast, src, dst, old, new, spec, values=v_fast, backend="cpu")
    torch.testing.assert_close(v_fast, v_ref, rtol=0, atol=0)
    if dtype is torch.float32:
        torch.testing.assert_close(k_fast, k_ref, rtol=0, atol=2e-6)
    else:  # fp32 results one ulp apart may round to neighbouring storage values
        ulp = torch.finfo(dtype).eps * k_ref.float().abs().clamp_min(torch.finfo(dtype).tiny)
        assert ((k_fast.float() - k_ref.float()).abs() <= ulp + 1e-6).all()
    untouched = torch.ones(keys.shape[1], dtype=torch.bool)
    untouched[dst] = False
    torch.testing.assert_close(k_fast[:, untouched], keys[:, untouched], rtol=0, atol=0)


def test_cpu_fast_path_past_one_chunk():
    from leyline_server.kernels.rotate_cpu import CPU_CHUNK

    spec = make_spec(PairLayout.HALF_SPLIT, offset=0, width=8)
    n = CPU_CHUNK + 123
    keys = torch.randn(2, 2 * n, 1, 8)
    src, dst = torch.arange(n), torch.arange(n, 2 * n)
    old = torch.arange(n) + 50
    new = torch.arange(n)
    k_ref, k_fast = keys.clone(), keys.clone()
    rotate_copy(k_ref, src, dst, old, new, spec, backend="torch")
    rotate_copy(k_fast, src, dst, old, new, spec, backend="cpu")
    torch.testing.assert_close(k_fast, k_ref, rtol=0, atol=2e-6)


def test_run_start_tells_runs_apart():
    from leyline_server.kernels.rotate_cpu import run_start

    assert run_start(torch.arange(5, 9)) == 5 and run_start(torch.tensor([7])) == 7
    assert run_start(torch.tensor([5, 7, 6, 8])) is None  # same ends, not a run
    assert run_start(torch.tensor([8, 7, 6])) is None and run_start(torch.tensor([], dtype=torch.long)) is None


def test_position_free_spec_only_copies():
    spec = RopeSpec(model_type="bloom", shiftable=True, rope_type="alibi")
    keys = torch.randn(2, 8, 2, 4)
    rotate_copy(
        keys,
        torch.tensor([0, 1]),
        torch.tensor([5, 6]),
        torch.tensor([0, 1]),
        torch.tensor([9, 9]),
        spec,
    )
    torch.testing.assert_close(keys[:, [5, 6]], keys[:, [0, 1]])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(keys=a["keys"][0]), "layers, slots"),
        (lambda a: a.update(keys=a["keys"].double()), "dtype"),
        (lambda a: a.update(dst=a["dst"][:2]), "dst_slots"),
        (lambda a: a.update(old=a["old"].float()), "integer"),
        (lambda a: a.update(dst=torch.tensor([1, 2, 99])), "slot indices"),
        (lambda a: a.update(dst=torch.tensor([1, 2, 5])), "identical"),
        (lambda a: a.update(dst=torch.tensor([6, 6, 7])), "repeat"),
        (lambda a: a.update(spec=make_spec(PairLayout.HALF_SPLIT, offset=24)), "does not fit"),
        (
            lambda a: a.update(spec=RopeSpec(model_type="gpt2", shiftable=False, reason="absolute")),
            "not shiftable",
        ),
    ],
)
def test_bad_arguments_are_refused(mutate, message):
    args = dict(
        keys=torch.randn(2, 10, 1, 32),
        src=torch.tensor([0, 1, 2]),
        dst=torch.tensor([5, 6, 7]),
        old=torch.tensor([0, 1, 2]),
        new=torch.tensor([3, 4, 5]),
        spec=make_spec(PairLayout.HALF_SPLIT),
    )
    mutate(args)
    with pytest.raises(ValueError, match=message):
        rotate_copy(args["keys"], args["src"], args["dst"], args["old"], args["new"], args["spec"])
