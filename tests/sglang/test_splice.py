"""Splices on SGLang's real radix cache, allocator and MLA/MHA pools (CPU).

The fill (prefill of replacements and tail) is the harness's test double: SGLang's request path
on the real tree and allocator, with KV rows computed by a tiny transformers model of the same
shape (see ``harness.py``). Everything else — plugin, IPC types, splicer, kernels, tree,
allocator, pools, rotary module — is SGLang's or Leyline's production code. Oracles:
``rotate_copy_torch`` for moved rows, a fresh transformers forward for layer 0 (which depends on
token and position only), SGLang's own matching for the next request, and slot accounting.
"""

from __future__ import annotations

import pytest
import torch

from leyline_sdk.core.directives import Directive, apply
from leyline_sdk.core.fallbacks import SERVER_CODES
from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.sglang.backend import SGLangSpliceBackend, namespace
from leyline_server.engines.sglang.launch import _model_info
from leyline_server.kernels import rotate_copy_torch
from leyline_server.splice import FallbackCode, SpliceError, splice
from tests.sglang.harness import Runtime, rotary_for

BASE = list(range(10, 90))
SCOPE = CacheScope(salt="key", private="s1")
NS = namespace(SCOPE)
EDIT = [Directive(start=20, end=45, replacement=[3, 4])]
VARIANTS = [("mla", "rust"), ("mha", "python"), ("mla", "python"), ("mha", "rust")]


def backend(rt: Runtime, **kw) -> SGLangSpliceBackend:
    """The production backend over the harness's transport, with the info the scheduler reports."""
    return SGLangSpliceBackend(rt, _model_info(rt.control("info", {}), "tiny"), **kw)


def pinned_slots(rt: Runtime, handle) -> torch.Tensor:
    """The slots the scheduler holds for ``handle`` (none for an empty handle, which pins nothing)."""
    if handle.pin is None:
        return torch.zeros(0, dtype=torch.int64)
    return rt.splicer._pinned(handle.pin)


def layer0_error(rt: Runtime, handle) -> float:
    """Max relative error of the cached layer-0 rows against a fresh forward of the handle's tokens."""
    slots = pinned_slots(rt, handle)
    if not slots.numel():
        return 0.0
    expected = rt.fresh_rows(handle.tokens[: slots.numel()])[0]
    actual = rt.read(slots, 0)
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-6)).item()


@pytest.mark.parametrize(("kind", "core"), VARIANTS)
def test_splice_moves_rows_like_the_oracle_and_the_next_request_hits(kind, core):
    rt = Runtime(kind, core=core)
    be = backend(rt)
    handle = be.prefill(BASE, SCOPE).handle
    old_slots = pinned_slots(rt, handle)
    before = [rt.read(old_slots, layer) for layer in range(2)]
    new, report = splice(be, handle, SpliceRequest(EDIT))
    assert report.applied and report.canary == "passed", report
    assert (report.reused_tokens, report.rotated_tokens, report.prefilled_tokens) == (20, 35, 2)
    assert new.tokens == apply(BASE, EDIT) and new.cached == 57 and new.exact == 22
    slots = pinned_slots(rt, new)
    assert torch.equal(slots[:20], old_slots[:20])  # kept in place (shared with the old branch)
    assert not set(slots[20:].tolist()) & set(old_slots.tolist())  # copy-on-write
    n, width = 35, 16  # MHA rows read back as K | V, each 16 wide
    for layer in range(2):
        rows = before[layer][45:80]
        keys = torch.zeros(1, 2 * n, *rows.shape[1:])
        keys[0, :n] = rows
        values = None
        if kind == "mha":
            keys, values = keys[..., :width].clone(), keys[..., width:].clone()
        rotate_copy_torch(keys, torch.arange(n), torch.arange(n, 2 * n), torch.arange(45, 80), torch.arange(22, 57),
                          rt.splicer.spec, values=values)  # fmt: skip
        oracle = keys[0, n:] if values is None else torch.cat([keys[0, n:], values[0, n:]], dim=-1)
        assert torch.equal(rt.read(slots[22:57], layer), oracle)
    rt.check()
    assert rt.prefill(new.tokens + [7, 8], NS) == 57  # SGLang's own match finds the spliced path
    rt.check()


@pytest.mark.parametrize(("kind", "core"), VARIANTS[:2])
def test_layer0_equals_a_fresh_forward_after_several_splices(kind, core):
    rt = Runtime(kind, core=core)
    be = backend(rt)
    handle, tokens = be.prefill(BASE, SCOPE).handle, list(BASE)
    for edit in (EDIT, [Directive(start=3, end=4)], [Directive(start=50, end=50, replacement=[5, 6, 7])]):
        handle, report = splice(be, handle, SpliceRequest(edit, base_length=len(tokens)))
        tokens = apply(tokens, edit)
        assert report.applied and handle.tokens == tokens
        assert layer0_error(rt, handle) < 1e-4
        rt.check()
    counts = be.rotation_counts(handle, range(handle.cached))
    assert max(counts) == 3 and counts[0] == 0  # the tail moved three times, the start never


def test_yarn_mla_spec_matches_transformers_and_the_layer0_oracle():
    from leyline_server.rope import rope_spec_from_config
    from leyline_server.tiny_models import YARN, build_model, tiny_config

    scaling = {"rope_type": "deepseek_yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    rt = Runtime("mla", rope_scaling=scaling)
    rt.config = tiny_config("deepseek_v2", layers=2, rope=YARN)
    rt.model = build_model(rt.config, seed=0)
    be = backend(rt)
    hf = rope_spec_from_config(rt.config)
    spec = rt.splicer.spec
    assert spec.layout == hf.layout == "interleaved" and spec.rotary_offset == 32
    torch.testing.assert_close(torch.tensor(spec.inv_freq), torch.tensor(hf.inv_freq), rtol=1e-6, atol=0)
    handle, report = splice(be, be.prefill(BASE, SCOPE).handle, SpliceRequest(EDIT))
    assert report.canary == "passed"
    assert layer0_error(rt, handle) < 1e-4


def test_rotated_kv_is_matched_only_by_the_session_that_asked():
    rt = Runtime("mla")
    be = backend(rt)
    new, _ = splice(be, be.prefill(BASE, SCOPE).handle, SpliceRequest(EDIT))
    for other in (CacheScope(salt="key", private="s2"), CacheScope(salt="key"), CacheScope()):
        assert rt.control("probe", {"tokens": new.tokens, "ns": namespace(other)})["matched"] == 0
    assert rt.prefill(new.tokens, namespace(CacheScope(salt="key", private="s2"))) == 0
    assert rt.control("probe", {"tokens": new.tokens, "ns": NS})["matched"] == 57
    rt.check()


def test_release_and_eviction_give_every_slot_back():
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    rt = Runtime("mha", pool_tokens=300)
    be = backend(rt)
    new, _ = splice(be, be.prefill(BASE, SCOPE).handle, SpliceRequest(EDIT))
    rt.check()
    rt.tree.evict(EvictParams(num_tokens=10_000))
    assert rt.control("probe", {"tokens": new.tokens, "ns": NS})["matched"] == 57  # pinned: kept
    be.release(new)
    rt.tree.evict(EvictParams(num_tokens=10_000))
    rt.check()
    assert rt.allocator.available_size() == 300


# -- fallbacks: each code provoked for real ---------------------------------------------------------
def _provoke(code: FallbackCode):
    rt = Runtime("mla", pool_tokens=100 if code is FallbackCode.CAPACITY else 400)
    directives, kwargs, be_kw = EDIT, {}, {}
    if code is FallbackCode.BASE_MISMATCH:
        kwargs["base_length"] = len(BASE) + 1
    elif code is FallbackCode.SPAN_INVALID:
        directives = [Directive(start=10, end=30), Directive(start=20, end=40)]
    elif code is FallbackCode.TOKEN_INVALID:
        directives = [Directive(start=10, end=30, replacement=[rt.config.vocab_size])]
    elif code is FallbackCode.PROMPT_MISMATCH:
        kwargs["prompt"] = BASE
    elif code is FallbackCode.ROPE_UNSUPPORTED:  # SGLang's dynamic-NTK rotary: frequencies move with length
        rt = Runtime("mla", rotary=rotary_for(rt.config, "mla", {"rope_type": "dynamic", "factor": 2.0}))
    elif code is FallbackCode.DRIFT_BUDGET:
        be_kw["rotation_budget"] = 0
    be = backend(rt, **be_kw)
    if code is FallbackCode.CONTEXT_LENGTH:  # refused before anything is allocated
        directives = [Directive(start=10, end=10, replacement=[5] * be.info.max_context_tokens)]
    if code is FallbackCode.CANARY_FAILED:  # Leyline's spec disagrees with SGLang's rotary module
        rt.splicer.spec = rt.splicer.spec.with_layout("half_split")
    return rt, be, directives, kwargs


@pytest.mark.parametrize("code", sorted(SERVER_CODES, key=lambda c: c.value))  # what a splice reports
def test_each_fallback_code_is_produced_and_strict_raises(code):
    rt, be, directives, kwargs = _provoke(code)
    new, report = splice(be, be.prefill(BASE, SCOPE).handle, SpliceRequest(directives, **kwargs))
    assert report.fallback is not None and report.fallback.code == code, report
    assert not report.applied and report.rotated_tokens == 0
    rt.check()
    refused = (FallbackCode.BASE_MISMATCH, FallbackCode.SPAN_INVALID, FallbackCode.TOKEN_INVALID,
               FallbackCode.CONTEXT_LENGTH)  # fmt: skip
    if code not in refused:
        expected = BASE if code is FallbackCode.PROMPT_MISMATCH else apply(BASE, directives)
        assert new.tokens == expected  # served as a forget (of the prompt, when it disagrees)
        assert layer0_error(rt, new) < 1e-4
    rt, be, directives, kwargs = _provoke(code)
    handle = be.prefill(BASE, SCOPE).handle
    with pytest.raises(SpliceError) as info:
        splice(be, handle, SpliceRequest(directives, strict=True, **kwargs))
    assert info.value.code is code
    assert rt.control("probe", {"tokens": BASE, "ns": NS})["matched"] == 80  # strict: nothing changed
    rt.check()


# -- blocks and the canary's meaning ----------------------------------------------------------------
BLOCK = [(37 * i + 11) % 900 + 50 for i in range(24)]


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_a_placed_block_brings_its_own_rows_not_the_sessions(kind):
    rt = Runtime(kind)
    be = backend(rt)
    block = be.prefill(BLOCK, CacheScope(salt="key", private="block")).handle
    place = [Directive(start=30, end=30, block="b")]
    new, report = splice(be, be.prefill(BASE, SCOPE).handle, SpliceRequest(place, blocks={"b": block}))
    assert report.applied and report.canary == "passed", report
    assert (report.rotated_tokens, report.prefilled_tokens) == (24 + 50, 0)
    assert new.tokens == BASE[:30] + BLOCK + BASE[30:]
    assert layer0_error(rt, new) < 1e-4  # the block's rows at 30..54, the session's moved after them
    be.release(block)
    be.release(new)
    rt.check()


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_the_canary_compares_with_the_models_own_keys_of_the_tokens(kind):
    rt = Runtime(kind)
    be = backend(rt)
    handle = be.prefill(BASE, SCOPE).handle
    stage = be.begin(handle, 20)
    from leyline_sdk.core.directives import KeptRun

    be.move(stage, handle, [KeptRun(45, 80, 22)])
    positions = [22, 30, 56]
    right = [BASE[45], BASE[53], BASE[79]]
    good = be.canary(stage, positions, right)
    assert good.ran and good.error < good.tolerance
    wrong = be.canary(stage, positions, [t + 1 for t in right])  # rows that are not these tokens'
    assert wrong.ran and wrong.error > 100 * wrong.tolerance
    shifted = be.canary(stage, positions, [BASE[44], BASE[52], BASE[78]])  # each row one position off
    assert shifted.ran and shifted.error > 100 * shifted.tolerance
    be.abort(stage)
    be.release(handle)
    rt.check()
