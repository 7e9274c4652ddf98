"""The embedded engine against transformers itself on the real model: prefill and decode tokens/s.

    .venv/bin/python benchmarks/bench_speed.py [--contexts 256 4096] [--repeat 3] [--decode 32]

SmolLM2-135M-Instruct (fp32, CPU, 2 threads). For each context length n:

* prefill — transformers: one plain forward over n tokens (``logits_to_keep=1``, as ``generate``
  does); engine: ``prefill`` of the same n tokens into the slot pool;
* decode — transformers: ``decode`` greedy steps with its own ``DynamicCache`` after the n-token
  context; engine: the same steps through ``EmbeddedEngine.decode`` (the pool + mirrors).

Best of ``repeat``; the greedy tokens of both are checked to be equal. Target: ≥ 0.9× at both sizes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from leyline_server.contract.values import SHARED, SamplingParams
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.presets import load_engine


def hf_prefill_and_decode(model: Any, ids: list[int], steps: int) -> tuple[float, float, list[int]]:
    """(prefill s, decode s, tokens) with transformers' own cache."""
    from transformers import DynamicCache

    with torch.no_grad():
        t0 = time.perf_counter()
        cache = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        token, tokens = int(out.logits[0, -1].argmax()), []
        t0 = time.perf_counter()
        for i in range(steps):
            tokens.append(token)
            pos = torch.tensor([[len(ids) + i]])
            out = model(input_ids=torch.tensor([[token]]), position_ids=pos, cache=out.cache, use_cache=True)
            token = int(out.logits[0, -1].argmax())
        return prefill, time.perf_counter() - t0, tokens


def engine_prefill_and_decode(engine: Any, ids: list[int], steps: int) -> tuple[float, float, list[int]]:
    """(prefill s, decode s, tokens) through the embedded engine (a fresh pool each time)."""
    t0 = time.perf_counter()
    result = engine.prefill(ids, SHARED)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = [s.token for s in engine.decode(result.handle, result.last_logits, SamplingParams(max_tokens=steps + 1))]
    decode = time.perf_counter() - t0
    engine.release(result.handle)
    engine.pool.free(engine.radix.evict(engine.pool.capacity))
    engine.mirrors.clear()
    return prefill, decode, tokens[:steps]


def main() -> None:
    """Print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine, tokenizer = load_engine(EngineConfig(model="smollm2-135m", kv_budget_mb=1024, context_length=8192))
    text = " ".join(f"line {i}: the river flows past the market and the bridge." for i in range(2000))
    corpus = tokenizer(text)["input_ids"]
    print(f"SmolLM2-135M-Instruct, fp32, CPU, {torch.get_num_threads()} threads, best of {args.repeat}\n")
    print("| context | prefill tok/s: transformers | engine | ratio | decode tok/s: transformers | engine | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.contexts:
        ids = corpus[:n]
        hf = [hf_prefill_and_decode(engine.model, ids, args.decode) for _ in range(args.repeat)]
        ours = [engine_prefill_and_decode(engine, ids, args.decode) for _ in range(args.repeat)]
        assert hf[0][2] == ours[0][2], "the engine's greedy tokens differ from transformers'"
        hp, hd = n / min(r[0] for r in hf), args.decode / min(r[1] for r in hf)
        op, od = n / min(r[0] for r in ours), args.decode / min(r[1] for r in ours)
        print(f"| {n:,} | {hp:.0f} | {op:.0f} | {op / hp:.2f}x | {hd:.1f} | {od:.1f} | {od / hd:.2f}x |")


if __name__ == "__main__":
    main()
