"""Splices on sliding-window models (Gemma-3-like, gpt-oss-like) against a fresh prefill of the edit.

The tiny presets' local layers attend over the last 8 positions (``tiny_models``); Gemma 3's local
layers rotate with base 10k and its global ones with 1M, gpt-oss's layers carry attention sinks.
The embedded engine keeps every row of a windowed layer, so an edit that pulls earlier rows back
into the window finds them in the cache. The oracle is the black-box one of docs/design.md: on a
one-layer checkpoint (a local layer, a global layer) the spliced cache and the next token's logits
equal a fresh prefill of the edited sequence; on deeper models the spliced turn's layer-0 rows and
every layer's moved rows (each rotated with its own layer's frequencies) do.
"""

from __future__ import annotations

import pytest
import torch

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import SamplingParams
from tests.server.engine_helpers import engine, layer0_oracle_error, pool_rows, prefill, run_splice

WINDOWED = ["tiny-gemma3", "tiny-gptoss"]
KINDS = ["sliding_attention", "full_attention"]
BASE = [(37 * i + 11) % 1000 + 7 for i in range(80)]
EDITS = {
    "far": [Directive(start=20, end=45, replacement=[3, 4, 5, 6])],  # far outside the last window
    # deleting 8 of the last 10 tokens pulls rows 65..69, long out of the window, back into it
    "re-enter": [Directive(start=70, end=78, replacement=[])],
    "inside": [Directive(start=74, end=76, replacement=[8, 9, 10])],  # within the last window
    "many": [
        Directive(start=2, end=2, replacement=[10, 11, 12]),
        Directive(start=30, end=50, replacement=[13]),
        Directive(start=72, end=73, replacement=[14, 15, 16, 17]),
    ],
}


def _engine(name: str, kinds: list[str]):
    return engine(name, layers=len(kinds), layer_types=kinds)


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_one_layer_splice_equals_a_fresh_prefill(name: str, kind: str, edit: str) -> None:
    directives = EDITS[edit]
    new = apply(BASE, directives)
    eng = _engine(name, [kind])
    pinned, report = run_splice(eng, prefill(eng, BASE)[0], directives)
    assert report.applied and report.fallback is None and report.rotated_tokens > 0
    assert report.canary == "passed"
    after, logits, reused = prefill(eng, new + [5], previous=pinned)
    assert reused == len(new)  # nothing recomputed: the spliced rows serve the next token
    ref = _engine(name, [kind])
    ref_pinned, ref_logits, _ = prefill(ref, new + [5])
    torch.testing.assert_close(
        pool_rows(eng, after.slots[: len(new)]), pool_rows(ref, ref_pinned.slots[: len(new)]), rtol=0, atol=1e-4
    )
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    eng.check_integrity()


def test_the_window_is_what_the_local_layer_sees() -> None:
    """The oracle can tell: a local layer's next token ignores an edit outside its window, a
    global layer's does not (so the tests above compare logits that an edit can change)."""
    edited = apply(BASE, EDITS["far"])
    for kind, moved in (("sliding_attention", False), ("full_attention", True)):
        eng = _engine("tiny-gemma3", [kind])
        a = prefill(eng, BASE[-8:] + [5], previous=None)[1]
        b = prefill(_engine("tiny-gemma3", [kind]), edited[-8:] + [5])[1]
        whole_a = prefill(_engine("tiny-gemma3", [kind]), BASE + [5])[1]
        whole_b = prefill(_engine("tiny-gemma3", [kind]), edited + [5])[1]
        assert torch.equal(a, b)  # the same last 8 tokens
        assert ((whole_a - whole_b).abs().max().item() > 1e-3) is moved


def _model_rotation(model, kind: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit cos and sin ``[T, D/2]`` of each rotary pair at ``positions``, from the model's own rotary
    module for layers of ``kind`` (Gemma 3 keeps one set of frequencies per kind)."""
    rotary = model.model.rotary_emb
    x = torch.zeros(1, dtype=torch.float32)
    per_kind = hasattr(rotary, f"{kind}_inv_freq")
    cos, sin = rotary(x, positions[None], kind) if per_kind else rotary(x, positions[None])
    cos, sin = cos[0].float(), sin[0].float()
    half = model.config.head_dim // 2
    cos, sin = cos[..., :half], sin[..., :half]  # Gemma repeats the pairs' angles; gpt-oss does not
    norm = torch.sqrt(cos**2 + sin**2)  # YaRN's mscale is inside the keys already
    return cos / norm, sin / norm


@pytest.mark.parametrize("name", WINDOWED)
def test_deeper_layers_rotate_with_their_own_frequencies(name: str) -> None:
    """Six layers (Gemma 3: five local, one global; gpt-oss: alternating). A deletion moves the last
    20 rows 30 positions back without recomputing them: each layer's moved rows must be its rows
    before, un-rotated at the old positions and rotated at the new ones by the model's own rotary
    module for that layer's kind (a rotation with the wrong layer's base misses by O(1))."""
    kinds = ["sliding_attention"] * 5 + ["full_attention"] if name == "tiny-gemma3" else KINDS * 3
    eng = _engine(name, kinds)
    before = pool_rows(eng, prefill(eng, BASE)[0].slots[60:]).clone()
    pinned, report = run_splice(eng, prefill(eng, BASE)[0], [Directive(start=10, end=40, replacement=[])])
    assert report.applied and report.canary == "passed"
    assert layer0_oracle_error(eng, pinned) <= 1e-4
    moved = pool_rows(eng, pinned.slots[30:])
    half = eng.model.config.head_dim // 2
    for layer, kind in enumerate(kinds):
        c_old, s_old = _model_rotation(eng.model, kind, torch.arange(60, 80))
        c_new, s_new = _model_rotation(eng.model, kind, torch.arange(30, 50))
        k = before[layer, ..., : 2 * half].float()
        k1, k2 = k[..., :half], k[..., half:]
        c_old, s_old, c_new, s_new = (t[:, None, :] for t in (c_old, s_old, c_new, s_new))
        x1, x2 = k1 * c_old + k2 * s_old, k2 * c_old - k1 * s_old  # back to no rotation
        expected = torch.cat([x1 * c_new - x2 * s_new, x2 * c_new + x1 * s_new], dim=-1)
        got = moved[layer, ..., : 2 * half].float()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4, msg=f"layer {layer} ({kind})")


@pytest.mark.parametrize("name", WINDOWED)
def test_a_spliced_session_decodes_like_a_fresh_one(name: str) -> None:
    """Greedy tokens after a splice that pulls rows back into a local layer's window equal those
    of a fresh prefill of the edited sequence (one local layer: the splice is exact there)."""
    directives = EDITS["re-enter"]
    new = apply(BASE, directives)
    eng = _engine(name, ["sliding_attention"])
    pinned, _ = run_splice(eng, prefill(eng, BASE)[0], directives)
    cont, logits, _ = prefill(eng, new + [9], previous=pinned)
    ref = _engine(name, ["sliding_attention"])
    ref_cont, ref_logits, _ = prefill(ref, new + [9])
    params = SamplingParams(max_tokens=12)
    got = [s.token for s in eng.decode(cont, logits, params)]
    assert got == [s.token for s in ref.decode(ref_cont, ref_logits, params)]


@pytest.mark.parametrize("name", WINDOWED)
def test_the_engine_serves_a_windowed_model_as_transformers_does(name: str) -> None:
    """Two layers (a local then a global one), a prompt five windows long in two turns: the
    engine's greedy tokens are transformers' own ``generate`` (whose local layers keep only the
    window), so the full rows the engine keeps change nothing but what a splice can reach."""
    eng = _engine(name, KINDS)
    prompt = [(31 * i + 7) % 900 + 20 for i in range(40)]
    pinned, logits, _ = prefill(eng, prompt[:25])
    pinned, logits, _ = prefill(eng, prompt, previous=pinned)
    ours = [s.token for s in eng.decode(pinned, logits, SamplingParams(max_tokens=16))]
    with torch.no_grad():
        out = eng.model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert ours == out[0, len(prompt) :].tolist()
    eng.check_integrity()
