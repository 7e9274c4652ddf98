"""The embedded engine's batched steps against the one-sequence path (the oracle).

Sequences decoded together in one packed forward give the tokens each gives alone; a prefill cut
into chunks that share steps with decoders gives the logits of a whole prefill. The batch changes
the shapes of the matrix products, so numbers may differ by float32 rounding (the tolerance here:
1e-4 relative on logits); greedy tokens of the tiny models (initializer range 0.2: peaked logits)
are the same.
"""

from __future__ import annotations

import pytest
import torch

from leyline_server.contract.jobs import Chunk
from leyline_server.contract.values import SamplingParams
from tests.server.engine_helpers import PRESET_NAMES, SCOPE, engine, prefill

PROMPTS = [[10 + i for i in range(n)] for n in (5, 17, 9, 30)]
STEPS = 12
# the sliding-window presets too: their local layers' masks are built per sequence in a packed step
BATCHED = [*PRESET_NAMES, "tiny-gemma3", "tiny-gptoss"]
GREEDY = SamplingParams(max_tokens=STEPS, ignore_eos=True)


def alone(name: str, prompt: list[int]) -> tuple[list[int], list[int]]:
    """(greedy tokens, the handle's tokens after) of ``prompt`` decoded alone on a fresh engine."""
    eng = engine(name, layers=2)
    pinned, logits, _ = prefill(eng, prompt)
    tokens = [s.token for s in eng.decode(pinned, logits, GREEDY)]
    eng.check_integrity()
    return tokens, list(pinned.tokens)


@pytest.mark.parametrize("name", BATCHED)
def test_sequences_decoded_together_give_the_tokens_each_gives_alone(name):
    eng = engine(name, layers=2)
    jobs = []
    for prompt in PROMPTS:
        pinned, logits, _ = prefill(eng, prompt)
        jobs.append(eng.start_decode(pinned, logits, GREEDY))
    steps: list[list[int]] = [[] for _ in jobs]
    while not all(j.finished for j in jobs):
        for i, job in enumerate(jobs):
            if not job.finished:
                steps[i].append(eng.sample(job).token)
        running = [j for j in jobs if not j.finished]
        if running:
            assert eng.forward([], running) == {}
    for job, prompt, got in zip(jobs, PROMPTS, steps, strict=True):
        eng.finish_decode(job, len(job.generated))
        tokens, handle_tokens = alone(name, prompt)
        assert got == tokens
        assert job.handle.tokens == handle_tokens and job.handle.cached == len(handle_tokens) - 1
    eng.check_integrity()


@pytest.mark.parametrize("name", BATCHED)
def test_a_chunked_prefill_sharing_steps_with_decoders_equals_a_whole_prefill(name):
    eng = engine(name, layers=2)
    decoders = []
    for prompt in PROMPTS[:2]:
        pinned, logits, _ = prefill(eng, prompt)
        decoders.append(eng.start_decode(pinned, logits, GREEDY))
    long = [200 + (i * 7) % 500 for i in range(40)]
    job = eng.start_prefill(long, SCOPE)
    tokens: list[list[int]] = [[], []]
    while job.left:
        for i, d in enumerate(decoders):
            if not d.finished:
                tokens[i].append(eng.sample(d).token)
        running = [d for d in decoders if not d.finished]
        assert eng.forward([Chunk(job, min(7, job.left))], running) == {}
    result = eng.finish_prefill(job)
    oracle = engine(name, layers=2).prefill(long, SCOPE)
    torch.testing.assert_close(result.last_logits, oracle.last_logits, rtol=1e-4, atol=1e-4)
    assert result.handle.tokens == long and result.handle.cached == len(long)
    for d, prompt, got in zip(decoders, PROMPTS[:2], tokens, strict=True):
        eng.finish_decode(d, len(d.generated))
        assert got == alone(name, prompt)[0][: len(got)]
    eng.check_integrity()


def test_finishing_a_decode_keeps_only_what_was_delivered():
    eng = engine("tiny-gqa", layers=2)
    pinned, logits, _ = prefill(eng, PROMPTS[1])
    job = eng.start_decode(pinned, logits, GREEDY)
    for _ in range(5):
        eng.sample(job)
        assert eng.forward([], [job]) == {}
    eng.finish_decode(job, 2)
    assert pinned.tokens == PROMPTS[1] + job.generated[:2] and pinned.cached == len(PROMPTS[1]) + 2
    eng.check_integrity()


def test_a_chunk_without_room_fails_alone_and_the_decode_goes_on():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=0.05)
    capacity = eng.pool.capacity
    pinned, logits, _ = prefill(eng, PROMPTS[0])
    decode = eng.start_decode(pinned, logits, GREEDY)
    eng.sample(decode)
    job = eng.start_prefill([300 + i for i in range(capacity)], SCOPE)
    failures = eng.forward([Chunk(job, job.left)], [decode])
    assert set(failures) == {job} and decode.pending is None and decode.logits is not None
    eng.abort_prefill(job)
    eng.finish_decode(decode, 1)
    eng.check_integrity()
