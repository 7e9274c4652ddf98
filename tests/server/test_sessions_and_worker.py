"""Sessions (ownership, TTL, cap) and the async worker (interleaving, cancellation)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from leyline_server.engines.embedded.engine import SamplingParams
from leyline_server.engines.embedded.worker import AsyncEngine
from leyline_server.sessions import SessionStore
from tests.server.engine_helpers import engine


def make_store(**kw):
    eng = engine("tiny-gqa", layers=1)
    released = []
    store = SessionStore(on_release=lambda p: (released.append(p), eng.unpin(p)), **kw)
    return eng, store, released


def test_sessions_are_private_to_their_owner():
    eng, store, _ = make_store()
    s = store.create("key-a", eng.prefill([10, 11, 12])[0])
    assert len(s.id) >= 24 and store.get(s.id, "key-a") is s
    assert store.get(s.id, "key-b") is None and store.get("nope", "key-a") is None
    assert not store.delete(s.id, "key-b")
    assert store.delete(s.id, "key-a") and store.get(s.id, "key-a") is None
    eng.check_integrity()


def test_ttl_and_cap_release_pins():
    now = [0.0]
    eng = engine("tiny-gqa", layers=1)
    released = []
    store = SessionStore(
        on_release=lambda p: (released.append(p), eng.unpin(p)),
        ttl_s=10,
        max_sessions=2,
        clock=lambda: now[0],
    )
    a = store.create(None, eng.prefill([10, 11])[0])
    b = store.create(None, eng.prefill([20, 21])[0])
    store.create(None, eng.prefill([30, 31])[0])  # pushes out a (least recently used)
    assert store.get(a.id, None) is None and len(released) == 1
    now[0] = 11.0
    assert store.get(b.id, None) is None and len(store) == 0 and len(released) == 3
    assert eng.radix.evictable_tokens() > 0  # released paths became evictable
    with pytest.raises(ValueError):
        SessionStore(on_release=print, ttl_s=0)


async def test_streams_interleave_and_cancellation_commits():
    eng = engine("tiny-mla", layers=1)
    front = AsyncEngine(eng)
    order = []

    async def run(tag, prompt, n):
        pinned, logits, _ = await front.call(eng.prefill, prompt)
        async for _step in front.stream(pinned, logits, SamplingParams(max_tokens=n)):
            order.append(tag)
        return pinned

    a, b = await asyncio.gather(run("a", [10, 11, 12], 6), run("b", [20, 21, 22], 6))
    assert order.count("a") == order.count("b") == 6
    assert order != ["a"] * 6 + ["b"] * 6  # interleaved step by step
    assert len(a.tokens) == 9 and len(a.slots) == 8

    pinned, logits, _ = await front.call(eng.prefill, [30, 31, 32])
    stream = front.stream(pinned, logits, SamplingParams(max_tokens=50))
    got = [await stream.__anext__() for _ in range(3)]
    await stream.aclose()  # client went away
    assert pinned.tokens == [30, 31, 32] + [s.token for s in got]
    await front.call(eng.check_integrity)
    front.shutdown()


def test_sampling_is_seeded_and_greedy_is_argmax():
    eng = engine("tiny-gqa", layers=1)
    pinned, logits, _ = eng.prefill([10, 11, 12])
    greedy = next(eng.decode(pinned, logits, SamplingParams(max_tokens=1)))
    assert greedy.token == int(torch.argmax(logits)) and greedy.finish_reason == "length"
    runs = []
    for _ in range(2):
        p, lg, _ = eng.prefill([10, 11, 12])
        runs.append(
            [s.token for s in eng.decode(p, lg, SamplingParams(max_tokens=5, temperature=1.0, top_p=0.9, seed=3))]
        )
    assert runs[0] == runs[1]
    stop = int(torch.argmax(logits))
    p, lg, _ = eng.prefill([10, 11, 12])
    steps = list(eng.decode(p, lg, SamplingParams(max_tokens=5, stop_token_ids=[stop])))
    assert [s.finish_reason for s in steps] == ["stop"]


def test_local_checkpoint_folder_loads_by_path(tmp_path):
    from leyline_sdk.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.engines.embedded.presets import load_engine, preset_config
    from leyline_server.tiny_models import build_model

    model = build_model(preset_config("tiny-gqa", layers=1), seed=5)
    model.save_pretrained(tmp_path)
    load_tiny_tokenizer().save_pretrained(tmp_path)
    eng, tok = load_engine(str(tmp_path), kv_budget_mb=1)
    ids = [10, 11, 12, 13]
    _, logits, _ = eng.prefill(ids)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert tok.eos_token == "<|im_end|>" and eng.eos_token_ids == [tok.eos_token_id]
    with pytest.raises(ValueError, match="neither a preset"):
        load_engine(str(tmp_path / "missing"))


def test_full_pool_raises_capacity_not_a_crash():
    from leyline_server.engines.embedded.engine import CapacityError

    eng = engine("tiny-gqa", layers=1, kv_budget_mb=0.01)
    with pytest.raises(CapacityError):
        eng.prefill(list(range(10, 10 + eng.pool.capacity + 5)))
    eng.check_integrity()
    eng.prefill([10, 11, 12])  # still serving


def test_tiny_temperatures_do_not_overflow():
    eng = engine("tiny-gqa", layers=1)
    pinned, logits, _ = eng.prefill([10, 11, 12])
    for temperature in (1e-300, 1e-5, 2.0):
        p, lg, _ = eng.prefill([10, 11, 12])
        steps = list(eng.decode(p, lg, SamplingParams(max_tokens=2, temperature=temperature, seed=1)))
        assert len(steps) == 2
    assert next(eng.decode(pinned, logits, SamplingParams(max_tokens=1, temperature=1e-300))).token == int(
        torch.argmax(logits)
    )
