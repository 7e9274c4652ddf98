"""The embedded engine behind the async Engine protocol: interleaving, cancellation, capacity, checkpoints."""

from __future__ import annotations

import asyncio

import pytest
import torch

from leyline_server.contract.values import CacheScope, CapacityError, SamplingParams
from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine
from tests.server.engine_helpers import engine, prefill


async def test_streams_interleave_and_cancellation_commits():
    eng = engine("tiny-mla", layers=1)
    front = AsyncEmbeddedEngine(eng)
    order = []

    async def run(tag, prompt, n):
        turn = await front.start_turn(prompt, CacheScope(), None, None)
        async for _step in front.stream(turn, SamplingParams(max_tokens=n)):
            order.append(tag)
        return turn

    a, b = await asyncio.gather(run("a", [10, 11, 12], 6), run("b", [20, 21, 22], 6))
    assert order.count("a") == order.count("b") == 6
    assert order != ["a"] * 6 + ["b"] * 6  # interleaved step by step
    assert len(a.handle.tokens) == 9 and a.handle.cached == 8 and a.generated == a.handle.tokens[3:]

    turn = await front.start_turn([30, 31, 32], CacheScope(), None, None)
    stream = front.stream(turn, SamplingParams(max_tokens=50))
    got = [await stream.__anext__() for _ in range(3)]
    await stream.aclose()  # client went away
    assert turn.handle.tokens == [30, 31, 32] + [s.token for s in got]
    for t in (a, b, turn):
        front.release(t.handle)
    await front.scheduler.call(eng.check_integrity)
    await front.close()


def test_local_checkpoint_folder_loads_by_path(tmp_path):
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.engines.config import EngineConfig
    from leyline_server.engines.embedded.presets import load_engine, preset_config
    from leyline_server.tiny_models import build_model

    model = build_model(preset_config("tiny-gqa", layers=1), seed=5)
    model.save_pretrained(tmp_path)
    load_tiny_tokenizer().save_pretrained(tmp_path)
    eng, tok = load_engine(EngineConfig(model=str(tmp_path), kv_budget_mb=1))
    ids = [10, 11, 12, 13]
    _, logits, _ = prefill(eng, ids)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert tok.eos_token == "<|im_end|>" and eng.info.eos_token_ids == (tok.eos_token_id,)
    with pytest.raises(ValueError, match="neither a preset"):
        load_engine(EngineConfig(model=str(tmp_path / "missing")))


def test_full_pool_raises_capacity_not_a_crash():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=0.01)
    with pytest.raises(CapacityError):
        prefill(eng, list(range(10, 10 + eng.pool.capacity + 5)))
    eng.check_integrity()
    prefill(eng, [10, 11, 12])  # still serving


def test_a_sliding_window_model_is_served_exactly_past_its_window(tmp_path):
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.engines.config import EngineConfig
    from leyline_server.engines.embedded.presets import load_engine
    from leyline_server.tiny_models import build_model, tiny_config

    model = build_model(tiny_config("mistral", layers=2, sliding_window=16), seed=2)
    model.save_pretrained(tmp_path)
    load_tiny_tokenizer().save_pretrained(tmp_path)
    eng, _ = load_engine(EngineConfig(model=str(tmp_path), kv_budget_mb=2))
    prompt = [(31 * i + 7) % 900 + 20 for i in range(40)]  # longer than the window
    pinned, logits, _ = prefill(eng, prompt[:25])
    pinned, logits, _ = prefill(eng, prompt, previous=pinned)  # a second turn, past the window
    ours = [s.token for s in eng.decode(pinned, logits, SamplingParams(max_tokens=20))]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None)
    assert ours == out[0, len(prompt) :].tolist()
    eng.check_integrity()


def test_models_the_pool_cannot_serve_are_refused_at_load_with_a_reason():
    from leyline_server.engines.embedded.loading import ModelLoadError, check_servable, resolve_model_path
    from leyline_server.tiny_models import tiny_config

    config = tiny_config("llama", layers=2)
    config.layer_types, config.attention_chunk_size = ["chunked_attention", "full_attention"], 8
    with pytest.raises(ModelLoadError, match="chunked_attention"):
        check_servable(config)
    with pytest.raises(ModelLoadError, match="neither a preset"):
        resolve_model_path("/nothing/here")


def test_many_sequences_of_different_lengths_share_the_mirrors_correctly():
    """More live sequences than mirrors, of different lengths, used out of order: eviction picks the
    least recently used mirror (not the oldest) and outputs stay exact."""
    eng = engine("tiny-gqa", layers=2, kv_budget_mb=8)
    oracle = engine("tiny-gqa", layers=2, kv_budget_mb=8)
    sequences = [[(7 * i + j) % 900 + 20 for j in range(40 + 150 * (i % 4))] for i in range(12)]
    order = [0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 3, 9, 10, 0, 11]  # sequence 0 comes back: later victims are not first
    handles: dict[int, object] = {}
    for i in order:
        tokens = sequences[i] = sequences[i] + [33]  # each visit appends a token (the same session's next turn)
        pinned, logits, _ = prefill(eng, tokens, previous=handles.pop(i, None))
        ours = [s.token for s in eng.decode(pinned, logits, SamplingParams(max_tokens=3))]
        sequences[i] = pinned.tokens
        handles[i] = pinned
        ref_pinned, ref_logits, _ = prefill(oracle, tokens)
        assert ours == [s.token for s in oracle.decode(ref_pinned, ref_logits, SamplingParams(max_tokens=3))]
        oracle.release(ref_pinned)
        oracle.pool.free(oracle.radix.evict(oracle.pool.capacity))
        oracle.mirrors.clear()
    assert len(eng.mirrors.mirrors) <= 8 and eng.mirrors.stats.evictions > 0
    eng.check_integrity()
