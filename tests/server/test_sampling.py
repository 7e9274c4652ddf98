"""Sampling against naive oracles: greedy = argmax, seeds, stops, penalties, logit_bias, logprobs."""

from __future__ import annotations

import torch

from leyline_server.contract.values import SamplingParams
from leyline_server.engines.embedded.sampling import Sampler
from tests.server.engine_helpers import engine, prefill


def test_sampling_is_seeded_and_greedy_is_argmax():
    eng = engine("tiny-gqa", layers=1)
    pinned, logits, _ = prefill(eng, [10, 11, 12])
    greedy = next(eng.decode(pinned, logits, SamplingParams(max_tokens=1)))
    assert greedy.token == int(torch.argmax(logits)) and greedy.finish_reason == "length"
    runs = []
    for _ in range(2):
        p, lg, _ = prefill(eng, [10, 11, 12])
        runs.append(
            [s.token for s in eng.decode(p, lg, SamplingParams(max_tokens=5, temperature=1.0, top_p=0.9, seed=3))]
        )
    assert runs[0] == runs[1]
    stop = int(torch.argmax(logits))
    p, lg, _ = prefill(eng, [10, 11, 12])
    steps = list(eng.decode(p, lg, SamplingParams(max_tokens=5, stop_token_ids=[stop])))
    assert [s.finish_reason for s in steps] == ["stop"]


def test_tiny_temperatures_do_not_overflow():
    eng = engine("tiny-gqa", layers=1)
    pinned, logits, _ = prefill(eng, [10, 11, 12])
    for temperature in (1e-300, 1e-5, 2.0):
        p, lg, _ = prefill(eng, [10, 11, 12])
        steps = list(eng.decode(p, lg, SamplingParams(max_tokens=2, temperature=temperature, seed=1)))
        assert len(steps) == 2
    first = next(eng.decode(pinned, logits, SamplingParams(max_tokens=1, temperature=1e-300)))
    assert first.token == int(torch.argmax(logits))


def test_logit_bias_and_penalties_follow_openai_arithmetic():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.5])
    assert Sampler(SamplingParams(logit_bias={3: 100.0})).step(logits).token == 3
    assert Sampler(SamplingParams(logit_bias={1: -100.0})).step(logits).token == 2
    sampler = Sampler(SamplingParams(frequency_penalty=0.6, presence_penalty=0.5))
    counts = [0, 0, 0, 0]
    picked = []
    for _ in range(12):  # the naive oracle: logit - count * frequency - (count > 0) * presence
        naive = [x - c * 0.6 - (c > 0) * 0.5 for x, c in zip(logits.tolist(), counts, strict=True)]
        expected = max(range(4), key=lambda i: naive[i])
        token = sampler.step(logits).token
        assert token == expected
        counts[token] += 1
        picked.append(token)
    assert len(set(picked)) >= 3  # the penalties really moved the choice


def test_logprobs_are_the_models_log_softmax():
    logits = torch.tensor([0.1, 2.0, -1.0, 0.7], dtype=torch.float32)
    step = Sampler(SamplingParams(logprobs=True, top_logprobs=2)).step(logits)
    expected = torch.log_softmax(logits.double(), -1)
    assert step.token == 1 and abs(step.logprob - float(expected[1])) < 1e-12
    assert [t.token for t in step.top_logprobs] == [1, 3]
    assert abs(step.top_logprobs[1].logprob - float(expected[3])) < 1e-12


def test_repetition_penalty_is_sglangs():
    logits = torch.tensor([2.0, 1.9, -1.0, -1.1])
    sampler = Sampler(SamplingParams(repetition_penalty=2.0))
    seen: set[int] = set()
    picked = []
    for _ in range(6):  # the naive oracle: seen tokens' positive logits halved, negative ones doubled
        naive = [x if i not in seen else (x / 2.0 if x > 0 else x * 2.0) for i, x in enumerate(logits.tolist())]
        expected = max(range(4), key=lambda i: naive[i])
        token = sampler.step(logits).token
        assert token == expected
        seen.add(token)
        picked.append(token)
    assert picked[:3] == [0, 1, 0]


def draws(params: SamplingParams, logits: torch.Tensor, n: int = 4000) -> torch.Tensor:
    """How often each token is drawn in ``n`` steps (no penalties: the steps are independent)."""
    sampler = Sampler(params)
    counts = torch.zeros(logits.numel())
    for _ in range(n):
        counts[sampler.step(logits).token] += 1
    return counts / n


def test_top_k_and_min_p_keep_the_right_tokens_with_the_right_weights():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    top2 = draws(SamplingParams(temperature=1.0, top_k=2, seed=1), logits)
    assert torch.allclose(top2, torch.tensor([4 / 7, 3 / 7, 0, 0]), atol=0.03), top2
    # min_p 0.6: tokens below 0.6 * 0.4 = 0.24 go (0.2 and 0.1)
    kept = draws(SamplingParams(temperature=1.0, min_p=0.6, seed=2), logits)
    assert torch.allclose(kept, torch.tensor([4 / 7, 3 / 7, 0, 0]), atol=0.03), kept
    assert draws(SamplingParams(temperature=1.0, top_k=1, seed=3), logits, 50).tolist() == [1.0, 0, 0, 0]
