"""Batched steps on the llama.cpp core: many sequences' decode tokens and prefill chunks in one ``llama_decode``.

The oracle is the single-sequence path (``prefill``/``decode``, one sequence at a time, on another
core): batching must not change a greedy token, a handle or what the sequence holds. The two-layer
model is used where it matters that later layers attend to the right cells.
"""

from __future__ import annotations

import numpy as np
import pytest

from leyline_server.contract.jobs import Chunk
from leyline_server.contract.logits import Processors, SuppressUntil
from leyline_server.contract.values import CacheScope, CapacityError, SamplingParams
from tests.llamacpp.helpers import BASE, engine, fresh_logits, max_diff

PROMPTS = [BASE[:40], BASE[:75], BASE[200:263], [9] + BASE[300:330]]  # the second shares 40 cells with the first
LIMITS = [12, 7, 16, 10]  # the streams end at different steps
SCOPES = [CacheScope(private=f"s{i}") for i in range(8)]
CLOSE = 1e-4  # float32 cache, no flash attention: chunked/batched vs whole/alone differ by ~1e-6


def _alone(path, prompts, params):
    """Each prompt prefilled and decoded alone with ``decode()`` (the oracle): (steps, handle) each."""
    ref = engine(path)
    out = []
    for prompt, scope, p in zip(prompts, SCOPES, params, strict=False):
        result = ref.prefill(prompt, scope)
        steps = list(ref.decode(result.handle, result.last_logits, p))
        ref.check(result.handle)
        out.append((steps, result.handle))
    ref.close()
    return out


def _together(eng, jobs):
    """Decode ``jobs`` in lockstep: one ``forward`` of every live job per step, then one ``sample`` each."""
    steps = {job: [eng.sample(job)] for job in jobs}
    while live := [job for job in jobs if not job.finished]:
        assert eng.forward([], live) == {}
        for job in live:
            steps[job].append(eng.sample(job))
    return [steps[job] for job in jobs]


def _start(eng, prompts, params):
    """Prefill each prompt (in its own scope) and start a decode job after it."""
    jobs = []
    for prompt, scope, p in zip(prompts, SCOPES, params, strict=False):
        result = eng.prefill(prompt, scope)
        jobs.append(eng.start_decode(result.handle, result.last_logits, p))
    return jobs


def test_four_sequences_decoded_together_equal_each_decoded_alone(tiny2):
    params = [SamplingParams(max_tokens=n, logprobs=True, top_logprobs=2) for n in LIMITS]
    expected = _alone(tiny2, PROMPTS, params)
    eng = engine(tiny2)
    jobs = _start(eng, PROMPTS, params)
    got = _together(eng, jobs)
    for job, steps, (ref_steps, ref_handle) in zip(jobs, got, expected, strict=True):
        assert [s.token for s in steps] == [s.token for s in ref_steps]
        assert [s.finish_reason for s in steps] == [s.finish_reason for s in ref_steps]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(steps, ref_steps, strict=True)) < CLOSE
        eng.finish_decode(job, len(job.generated))
        handle = job.handle
        assert (handle.tokens, handle.cached, handle.exact) == (ref_handle.tokens, ref_handle.cached, ref_handle.exact)
        eng.check(handle)
    eng.close()


def test_processors_mask_each_row_in_place_in_a_batch(tiny1):
    """A processor per stream (min_tokens over that stream's own greedy choices) masks only its row."""
    plain = _alone(tiny1, PROMPTS[:2], [SamplingParams(max_tokens=6)] * 2)
    banned = [sorted(set(s.token for s in steps)) for steps, _ in plain]
    params = SamplingParams(max_tokens=6, logprobs=True)

    def processors(i):
        return Processors([SuppressUntil(banned[i], 4)])

    ref = engine(tiny1)
    expected = []
    for i, prompt in enumerate(PROMPTS[:2]):
        result = ref.prefill(prompt, SCOPES[i])
        expected.append(list(ref.decode(result.handle, result.last_logits, params, processors=processors(i))))
    ref.close()
    eng = engine(tiny1)
    jobs = []
    for i, prompt in enumerate(PROMPTS[:2]):
        result = eng.prefill(prompt, SCOPES[i])
        jobs.append(eng.start_decode(result.handle, result.last_logits, params, processors(i)))
    got = _together(eng, jobs)
    for i, (steps, ref_steps) in enumerate(zip(got, expected, strict=True)):
        tokens = [s.token for s in steps]
        assert tokens == [s.token for s in ref_steps] and not set(tokens[:4]) & set(banned[i])
        assert max(abs(a.logprob - b.logprob) for a, b in zip(steps, ref_steps, strict=True)) < CLOSE
    eng.close()


@pytest.mark.parametrize("chunk", [7, 600])  # 600: the 525 tokens left are more than n_batch (512): two calls
def test_a_chunked_prefill_shares_steps_with_two_decodes(tiny2, chunk):
    params = [SamplingParams(max_tokens=20), SamplingParams(max_tokens=14)]
    expected = _alone(tiny2, PROMPTS[:2], params)
    prompt = BASE[:33] + BASE[500:540] if chunk == 7 else BASE  # reusing cells of a decoding sequence: 33, 75
    eng = engine(tiny2)
    decodes = _start(eng, PROMPTS[:2], params)
    got = {job: [eng.sample(job)] for job in decodes}
    job = eng.start_prefill(prompt, SCOPES[5])
    assert job.reused == (33 if chunk == 7 else 75) and job.left == len(prompt) - job.reused
    while job.left or any(not d.finished for d in decodes):
        live = [d for d in decodes if not d.finished]
        chunks = [Chunk(job, min(chunk, job.left))] if job.left else []
        assert eng.forward(chunks, live) == {}
        for d in live:
            got[d].append(eng.sample(d))
        if chunks and job.left:
            assert job.logits is None and eng.ctx.pos_max(job.entry.seq) == job.done - 1
    prefilled = eng.finish_prefill(job)
    ref = fresh_logits(tiny2, prompt)
    assert max_diff(prefilled.last_logits, ref) < CLOSE  # float32, no flash attention: ~1e-6 in practice
    assert prefilled.handle.cached == len(prompt) and prefilled.handle.exact == len(prompt)
    eng.check(prefilled.handle)
    first = next(eng.decode(prefilled.handle, prefilled.last_logits, SamplingParams(max_tokens=1)))
    assert first.token == int(np.argmax(ref))
    for d, (ref_steps, _) in zip(decodes, expected, strict=True):
        assert [s.token for s in got[d]] == [s.token for s in ref_steps]  # unchanged by the mixing
        eng.finish_decode(d, len(d.generated))
        eng.check(d.handle)
    eng.close()


def test_a_prefill_in_progress_is_never_parked_or_evicted_between_chunks(tiny1):
    eng = engine(tiny1, park_threshold=0.0)  # every idle sequence is worth parking
    prompt = BASE[:100]
    job = eng.start_prefill(prompt, SCOPES[0])
    assert eng.forward([Chunk(job, 40)], []) == {}
    other = eng.prefill([9] + BASE[:200], SCOPES[1]).handle  # its focus parks every idle sequence
    eng.release(other)
    eng.drop_idle()  # evicts every unpinned entry
    assert job.entry.resident and eng.ctx.pos_max(job.entry.seq) == 39
    assert eng.forward([Chunk(job, job.left)], []) == {}
    prefilled = eng.finish_prefill(job)
    assert max_diff(prefilled.last_logits, fresh_logits(tiny1, prompt)) < CLOSE
    eng.check(prefilled.handle)
    assert not prefilled.handle.entry.busy
    eng.close()


@pytest.mark.parametrize("delivered", [0, 2])
def test_finish_decode_keeps_only_delivered_kv(tiny1, delivered):
    eng = engine(tiny1)
    jobs = _start(eng, PROMPTS[:2], [SamplingParams(max_tokens=8)] * 2)
    for _ in range(5):  # five tokens sampled, four of them forwarded: KV past what is delivered
        for job in jobs:
            eng.sample(job)
        assert eng.forward([], jobs) == {}
    ahead, other = jobs
    eng.finish_decode(ahead, delivered)
    prompt = PROMPTS[0]
    handle = ahead.handle
    assert handle.tokens == prompt + ahead.generated[:delivered] and len(ahead.generated) == 5
    assert handle.cached == len(handle.tokens) and not ahead.entry.busy
    eng.check(handle)  # the sequence ends at the last delivered token
    steps = _together(eng, [other])[0]  # the other stream goes on, untouched
    assert len(other.generated) == 8 and steps[-1].finish_reason == "length"
    eng.finish_decode(other, 8)
    eng.check(other.handle)
    follow = handle.tokens + [5, 6, 7]
    result = eng.prefill(follow, SCOPES[0], previous=handle)
    assert result.reused == len(handle.tokens)
    assert max_diff(result.last_logits, fresh_logits(tiny1, follow)) < CLOSE
    eng.close()


@pytest.mark.parametrize("n_ctx, size", [(256, 221), (768, 720)])  # 720: the step's first call (512) fits
def test_a_chunk_that_does_not_fit_fails_while_the_decode_advances(tiny1, n_ctx, size):
    params = SamplingParams(max_tokens=6)
    ((expected, _),) = _alone(tiny1, [PROMPTS[2]], [params])
    eng = engine(tiny1, n_ctx=n_ctx, park_budget=0)  # nothing to park into: only unpinned cache is evicted
    assert eng.ctx.n_ctx == n_ctx
    (decode,) = _start(eng, [PROMPTS[2]], [params])
    spare = eng.prefill([3] + BASE[:29], SCOPES[2]).handle
    spare_entry = spare.entry
    eng.release(spare)  # ordinary cache: evicted to make room before anything fails
    eng.sample(decode)
    job = eng.start_prefill(([7] + BASE + BASE)[:size], SCOPES[1])  # next to the decode's 64 cells
    failures = eng.forward([Chunk(job, job.left)], [decode])
    assert set(failures) == {job} and isinstance(failures[job], CapacityError)
    assert spare_entry not in eng.cache.entries.values()
    assert job.done == 0 and job.logits is None and eng.ctx.pos_max(job.entry.seq) == -1  # not advanced
    assert decode.pending is None and decode.entry.cached == len(PROMPTS[2]) + 1  # advanced
    eng.abort_prefill(job)
    steps = [eng.sample(decode)]
    while not decode.finished:
        assert eng.forward([], [decode]) == {}
        steps.append(eng.sample(decode))
    assert [s.token for s in steps] == [s.token for s in expected[1:]]
    eng.finish_decode(decode, len(decode.generated))
    eng.check(decode.handle)
    assert decode.handle.tokens[len(PROMPTS[2]) :] == [s.token for s in expected]
    eng.close()


def test_decodes_that_cannot_fit_all_fail_and_stay_as_they_were(tiny1):
    eng = engine(tiny1, n_ctx=256, park_budget=0)
    a = eng.prefill(BASE[:128], SCOPES[0])
    b = eng.prefill([9] + BASE[:127], SCOPES[1])  # the pool is full: 256 cells
    jobs = [eng.start_decode(r.handle, r.last_logits, SamplingParams(max_tokens=4)) for r in (a, b)]
    for job in jobs:
        eng.sample(job)
    failures = eng.forward([], jobs)
    assert set(failures) == set(jobs) and all(isinstance(e, CapacityError) for e in failures.values())
    assert all(job.pending is not None and job.entry.cached == 128 for job in jobs)
    for job in jobs:
        eng.finish_decode(job, 0)
        eng.check(job.handle)
    eng.close()


def test_a_row_overwritten_before_sampling_is_refused(tiny1):
    eng = engine(tiny1)
    (job,) = _start(eng, PROMPTS[:1], [SamplingParams(max_tokens=4)])
    eng.sample(job)
    assert eng.forward([], [job]) == {}
    eng.prefill(BASE[100:140], SCOPES[1])  # another llama_decode before the job's sample
    with pytest.raises(RuntimeError, match="overwritten"):
        eng.sample(job)
    eng.finish_decode(job, len(job.generated))
    eng.check(job.handle)
    eng.close()
