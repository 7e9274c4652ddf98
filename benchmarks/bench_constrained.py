"""Constrained decoding's per-token cost: decode under a JSON schema against unconstrained decode.

    .venv/bin/python benchmarks/bench_constrained.py [--engines embedded llamacpp] [--tokens 96] [--repeat 3]

SmolLM2-135M-Instruct on each engine (embedded: fp32 torch; llama.cpp: the GGUF), CPU, 2 threads.
The same prompt is prefilled once per run; then

* unconstrained — ``tokens`` greedy steps with ``ignore_eos`` (nothing stops early);
* constrained — greedy steps under a JSON schema (compiled by xgrammar, as the server does for
  ``response_format: json_schema``) whose ``minItems`` keeps the grammar open for at least
  ``tokens`` steps; the grammar's compile time is reported apart (the server caches it per schema).

Per-token time is decode time / tokens, best of ``repeat``; the mask's own share is timed by
running the same masks over saved logits rows without the model. The constrained output is
checked to be a prefix of JSON the schema accepts (its first ``tokens`` tokens).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from typing import Any

import torch

from leyline_server.contract.logits import Processors
from leyline_server.contract.values import SHARED, Constraint, SamplingParams
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.factory import build_engine

SCHEMA = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "integer"}, "note": {"type": "string"}}},
            "minItems": 64,
        }
    },
    "required": ["steps"],
}
PROMPT = [{"role": "user", "content": "List the steps to bake bread, as JSON."}]


def decode(
    engine: Any, ids: list[int], params: SamplingParams, processors: Processors | None
) -> tuple[float, list[int]]:
    """(seconds, tokens) of one greedy decode after a fresh prefill of ``ids``."""
    core = engine.core
    result = core.prefill(ids, SHARED)
    start = time.perf_counter()
    tokens = [step.token for step in core.decode(result.handle, result.last_logits, params, None, processors)]
    elapsed = time.perf_counter() - start
    core.release(result.handle)
    return elapsed, tokens


def mask_only(engine: Any, constraint: Constraint, tokens: list[int]) -> float:
    """Seconds to mask and advance the grammar over ``tokens`` alone (random rows, no model)."""
    mask = engine.grammar.mask(constraint)
    rows = torch.randn(len(tokens), engine.info.vocab_size)
    start = time.perf_counter()
    for row, token in zip(rows, tokens, strict=True):
        mask.apply(row)
        mask.accept(token)
    return time.perf_counter() - start


def run(name: str, steps: int, repeat: int) -> str:
    """One table row for engine ``name``."""
    engine, tokenizer = build_engine(
        EngineConfig(engine=name, model="smollm2-135m", kv_budget_mb=256, context_length=2048)
    )
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    constraint = Constraint(kind="json_schema", value=json.dumps(SCHEMA))
    start = time.perf_counter()
    engine.grammar.compile(constraint)
    compile_ms = (time.perf_counter() - start) * 1000
    free = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    bound = SamplingParams(max_tokens=steps, temperature=0.0, constraint=constraint)
    decode(engine, ids, free, None)  # warm-up
    plain = min(decode(engine, ids, free, None)[0] for _ in range(repeat))
    runs = [decode(engine, ids, bound, engine.processors(bound)) for _ in range(repeat)]
    tokens = runs[0][1]
    assert len(tokens) == steps, f"the grammar ended after {len(tokens)} tokens"
    text = tokenizer.decode(tokens)
    assert text.startswith('{"steps": ['), text[:40]
    masked = min(r[0] for r in runs)
    alone = min(mask_only(engine, constraint, tokens) for _ in range(repeat))
    if hasattr(engine.core, "close"):
        engine.core.close()
    per_plain, per_masked, per_mask = (1000 * t / steps for t in (plain, masked, alone))
    return (
        f"| {name} | {per_plain:.2f} | {per_masked:.2f} | {per_masked - per_plain:+.2f} "
        f"({per_masked / per_plain - 1:+.0%}) | {per_mask:.3f} | {compile_ms:.0f} |"
    )


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    engines = ["embedded"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") else [])
    parser.add_argument("--engines", nargs="+", default=engines)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"SmolLM2-135M-Instruct, CPU, 2 threads, {args.tokens} greedy tokens, best of {args.repeat}\n")
    print("| engine | ms/token: free | under JSON schema | cost | mask + advance alone | compile ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.engines:
        print(run(name, args.tokens, args.repeat), flush=True)


if __name__ == "__main__":
    main()
