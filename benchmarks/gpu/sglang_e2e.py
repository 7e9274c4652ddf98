"""SGLang end to end with the Leyline plugin: a DeepSeek-V2-Lite-shaped model with dummy weights.

Writes the model's ``config.json`` (no download, no tokenizer: ``--skip-tokenizer-init``), starts
SGLang in-process through :func:`build_sglang_engine` and drives Leyline's Engine protocol:

1. a conversation of two turns: prefix P (1k) + a stale span S (512), a reply of 8 tokens, then D
   downstream tokens (8k, 32k) and another reply (its cached tokens: the whole first turn);
2. an edit of S (replaced by 64 tokens) and the next turn, once as an ``amortize`` splice and once
   as a ``forget`` (re-prefill from the edit), each in its own session namespace;
3. for each: splice report, the next request's cached tokens, and continue-after-edit latency
   (from the turn's start to its first generated token).

    python benchmarks/gpu/sglang_e2e.py --out results.json [--downstream 8192 32768] [--dry-run]

``--dry-run`` writes the config and prints SGLang's command line without starting anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DSV2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
    "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1,
    "topk_group": 1, "norm_topk_prob": False, "scoring_func": "softmax", "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}, "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 100000, "eos_token_id": 100001, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True,
}  # fmt: skip
PREFIX, SPAN, REPLACEMENT, USER, REPLY = 1024, 512, 64, 32, 8


def write_model(folder: Path) -> Path:
    """A model folder holding only DeepSeek-V2-Lite's config (weights are SGLang's dummy init)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(DSV2_LITE, indent=1))
    return folder


def sglang_args(model: Path, backend: str, context: int) -> list[str]:
    """SGLang's command line for the benchmark (page size 1, no CUDA graphs: a fast start)."""
    return [
        "--model-path", str(model), "--load-format", "dummy", "--skip-tokenizer-init", "--page-size", "1",
        "--attention-backend", backend, "--context-length", str(context), "--mem-fraction-static", "0.85",
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        "--max-running-requests", "8", "--log-level", "warning",
    ]  # fmt: skip


def _tokens(rng: random.Random, n: int, vocab: int = 100_000) -> list[int]:
    return [rng.randrange(vocab // 2, vocab) for _ in range(n)]


async def _edit_turn(engine: Any, downstream: int, mode: str, rng: random.Random) -> dict[str, Any]:
    from leyline_sdk.core.directives import Directive, apply
    from leyline_server.contract.values import CacheScope, SamplingParams, SpliceRequest

    vocab = min(engine.info.vocab_size, 100_000)

    scope = CacheScope(private=f"bench-{mode}-{downstream}")
    first = await engine.start_turn(_tokens(rng, PREFIX + SPAN, vocab), scope, None, None)  # system + stale tool output
    async for _ in engine.stream(first, SamplingParams(max_tokens=REPLY)):
        pass
    prompt = first.prompt + first.generated + _tokens(rng, downstream, vocab)  # everything said since
    turn = await engine.start_turn(prompt, scope, first.handle, None)
    async for _ in engine.stream(turn, SamplingParams(max_tokens=REPLY)):
        pass
    conversation = turn.prompt + turn.generated
    edit = Directive(start=PREFIX, end=PREFIX + SPAN, replacement=_tokens(rng, REPLACEMENT, vocab), mode=mode)
    prompt = apply(conversation, [edit]) + _tokens(rng, USER, vocab)
    request = SpliceRequest([edit], base_length=len(conversation), prompt=prompt)
    started = time.perf_counter()
    turn2 = await engine.start_turn(prompt, scope, turn.handle, request)
    token_at = None
    async for _ in engine.stream(turn2, SamplingParams(max_tokens=1)):
        token_at = time.perf_counter()
    report = turn2.report
    engine.release(turn2.handle)
    return {
        "conversation_reused": turn.reused,
        "conversation_expected": len(first.prompt) + REPLY - 1,  # the last reply token has no KV yet
        "ttft_ms": ((token_at or time.perf_counter()) - started) * 1e3,
        "applied": bool(report and report.applied),
        "fallback": report.fallback.code if report and report.fallback else None,
        "canary": report.canary if report else "skipped",
        "splice_ms": report.splice_ms if report else 0.0,
        "rotated": report.rotated_tokens if report else 0,
        "prefilled": report.prefilled_tokens if report else 0,
        "next_cached": turn2.reused,
        "expected_cached": len(apply(conversation, [edit])),  # the spliced (or re-prefilled) sequence
        "prompt_tokens": len(prompt),
    }


async def run(engine: Any, downstream: list[int], warmup: int = 1024) -> dict[str, Any]:
    """Warm up, then the amortize and forget edit turns at each downstream size."""
    rng = random.Random(0)
    await _edit_turn(engine, warmup, "amortize", rng)  # compile kernels, fill the tree
    results: dict[str, Any] = {}
    for d in downstream:
        results[str(d)] = {mode: await _edit_turn(engine, d, mode, rng) for mode in ("amortize", "forget")}
        print(json.dumps({d: results[str(d)]}), flush=True)
    return results


def main() -> int:
    """Parse, write the model, run (or print the plan with ``--dry-run``), save JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--downstream", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "leyline-dsv2-lite")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    context = PREFIX + SPAN + max(args.downstream) + REPLY + USER + 1024
    argv = sglang_args(write_model(args.model_dir), args.attention_backend, context)
    if args.dry_run:
        print("sglang " + " ".join(argv))
        return 0
    from leyline_server.engines.sglang.launch import build_sglang_engine

    started = time.perf_counter()
    engine, _ = build_sglang_engine(argv, served_name="dsv2-lite-dummy")
    startup = time.perf_counter() - started
    print(f"SGLang up in {startup:.0f} s: {engine.info}", flush=True)

    async def go() -> dict[str, Any]:
        try:
            return await run(engine, args.downstream)
        finally:
            await engine.close()

    results = asyncio.run(go())
    args.out.write_text(json.dumps({"startup_s": startup, "backend": args.attention_backend, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
