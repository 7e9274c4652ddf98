"""The embedded engine behind the async Engine protocol: interleaving, cancellation, capacity, checkpoints."""

from __future__ import annotations

import asyncio

import pytest
import torch

from leyline_server.engines.base import CacheScope, CapacityError, SamplingParams
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
    await front.worker.call(eng.check_integrity)
    await front.close()


def test_local_checkpoint_folder_loads_by_path(tmp_path):
    from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.engines.embedded.presets import load_engine, preset_config
    from leyline_server.tiny_models import build_model

    model = build_model(preset_config("tiny-gqa", layers=1), seed=5)
    model.save_pretrained(tmp_path)
    load_tiny_tokenizer().save_pretrained(tmp_path)
    eng, tok = load_engine(str(tmp_path), kv_budget_mb=1)
    ids = [10, 11, 12, 13]
    _, logits, _ = prefill(eng, ids)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert tok.eos_token == "<|im_end|>" and eng.info.eos_token_ids == (tok.eos_token_id,)
    with pytest.raises(ValueError, match="neither a preset"):
        load_engine(str(tmp_path / "missing"))


def test_full_pool_raises_capacity_not_a_crash():
    eng = engine("tiny-gqa", layers=1, kv_budget_mb=0.01)
    with pytest.raises(CapacityError):
        prefill(eng, list(range(10, 10 + eng.pool.capacity + 5)))
    eng.check_integrity()
    prefill(eng, [10, 11, 12])  # still serving


def test_sliding_window_models_are_refused_at_load_with_a_reason(tmp_path):
    from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.engines.embedded.loading import ModelLoadError
    from leyline_server.engines.embedded.presets import load_engine
    from leyline_server.tiny_models import build_model, tiny_config

    build_model(tiny_config("mistral", layers=1, sliding_window=64)).save_pretrained(tmp_path)
    load_tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="sliding-window attention .window 64. is not supported"):
        load_engine(str(tmp_path), kv_budget_mb=1)
    with pytest.raises(ModelLoadError, match="neither a preset"):
        load_engine(str(tmp_path / "nothing-here"))
