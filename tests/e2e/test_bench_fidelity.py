"""The fidelity benchmark (benchmarks/bench_fidelity.py): its cases, its measures, its harness, and
the floor it sets on a real model.

* the cases say what they claim: the edit removes the value an answer must not come from, and
  keeps the one it must;
* the measures agree with independent implementations (torch's KL and cosine, Wilson's interval
  worked by hand);
* the harness compares what it says: on a one-layer model the δ-rotation is exact, so the splice
  arm must answer like the forget arm (the same greedy tokens, logits equal to rounding);
* on Qwen2.5-Coder-0.5B (``make models``), a seeded subset of the eviction family: the splice
  answers right no more than one case in ten less often than ``forget`` does (on seeds
  1000–1009: full 8, forget 7, splice 8 of 10).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from fidelity_arms import Runner, run_case  # noqa: E402
from fidelity_cases import FAMILIES, Case  # noqa: E402
from fidelity_stats import cosine, in_top, kl, probability, wilson  # noqa: E402
from notes_cases import mentions  # noqa: E402

from leyline_server.engines.config import EngineConfig  # noqa: E402
from leyline_server.engines.embedded.presets import load_engine  # noqa: E402

EVICTION_MARGIN = 0.10  # splice accuracy may fall at most this far below forget's on the eviction family


def _text(messages: list[dict]) -> str:
    return "\n".join(str(m.get("content") or "") + str(m.get("tool_calls") or "") for m in messages)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_case_removes_the_old_value_and_keeps_the_right_one(family):
    for seed in range(20):
        case: Case = FAMILIES[family](seed)
        assert FAMILIES[family](seed) == case  # seeded
        if case.old:
            assert mentions(_text(case.messages), case.old), (family, seed)
            assert not mentions(_text(case.edited), case.old), (family, seed)
        if case.right:
            assert mentions(_text(case.edited), case.right), (family, seed)
        assert len(case.versions) == max(case.asks())


def test_the_measures_match_independent_implementations():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    expected = torch.nn.functional.kl_div(
        torch.log_softmax(torch.tensor(b), -1), torch.log_softmax(torch.tensor(a), -1), log_target=True, reduction="sum"
    )
    assert kl(a, b) == pytest.approx(float(expected), rel=1e-9)
    expected_cosine = torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), 0)
    assert cosine(a, b) == pytest.approx(float(expected_cosine))
    probs = torch.softmax(torch.tensor(a), -1)
    assert probability(a, 7) == pytest.approx(float(probs[7]))
    ranked = torch.argsort(probs, descending=True).tolist()
    assert in_top(a, ranked[4], 5) and not in_top(a, ranked[5], 5)
    # Wilson score interval, worked by hand: 5 of 10 -> 0.2366..0.7634; 0 of 10 -> 0..0.2775
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)


def test_on_a_one_layer_model_the_splice_arm_answers_like_forget():
    core, tokenizer = load_engine(EngineConfig(model="tiny-gqa", preset_layers=1, kv_budget_mb=64))
    runner = Runner(core, tokenizer, max_tokens=8)
    for family in ("eviction", "errata"):
        out, fallbacks = run_case(runner, FAMILIES[family](3))
        assert fallbacks == {arm: 0 for arm in fallbacks}
        spliced, forgot = out["splice", 1, ""], out["forget", 1, ""]
        assert spliced.tokens == forgot.tokens
        np.testing.assert_allclose(spliced.logits, forgot.logits, atol=1e-3)
        assert out["full", 0, ""].logits.tolist() != forgot.logits.tolist()  # the edit did change the context


def test_on_qwen_the_splice_answers_nearly_as_often_as_forget():
    from bench_fidelity import load, run_family

    runner = load("qwen2.5-coder-0.5b", "llamacpp")
    results = run_family(runner, "eviction", 10, seed=1000)
    score = {arm: sum(mentions(out[arm, 0 if arm == "full" else 1, ""].text, case.right) for case, out, _ in results)
             for arm in ("full", "forget", "splice")}  # fmt: skip
    assert score["full"] >= 7, score  # the model answers from its context: the comparison means something
    assert score["splice"] >= score["forget"] - EVICTION_MARGIN * len(results), score


def test_the_benchmark_runs_as_documented_and_prints_every_family(tmp_path):
    import subprocess

    md = tmp_path / "fidelity.md"
    args = "--model smollm2-135m --cases 1 --successive-cases 1 --max-tokens 4".split()
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fidelity.py"), *args, "--md", str(md)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for family in FAMILIES:
        assert f"### {family} (1 cases" in md.read_text()
    assert "P(the secret's first token)" in out.stdout and "budget 2:" in out.stdout
