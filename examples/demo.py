"""Leyline demo: a scripted tool-heavy agent against the embedded server, twice.

    python examples/demo.py [--turns 16] [--model tiny-mla] [--layers 4]

Run 1 — Leyline: ``AsyncLeyline`` with ``TruncateOlderThanN(2)``; every eviction is sent as an
``amortize`` directive and spliced in place. Run 2 — plain re-prefill: the same policies and the
same trace through a plain OpenAI client, so each eviction throws away the cache after the
evicted message. Each run gets a fresh server. A progress bar, a per-turn table and a summary
(prompt, reused, rotated, prefilled tokens, time) are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn  # noqa: E402
from leyline_policies import TruncateOlderThanN, run_policies  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402

Row = tuple[int, int, int, int, int, float]  # turn, prompt, reused, rotated, prefilled, ms


def progress(label: str, done: int, total: int, width: int = 30) -> None:
    """A one-line progress bar on stderr."""
    if not sys.stderr.isatty() and done != total:
        return  # a log gets the finished bar only
    filled = int(width * done / total)
    sys.stderr.write(f"\r{label:22s} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


async def run_leyline(url: str, turns: int, model: str) -> list[Row]:
    """The agent through AsyncLeyline: directives on every eviction."""
    client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)])
    session = client.session(tools=TOOLS)
    messages, rows = [SYSTEM, TASK], []
    for turn in range(turns):
        t0 = time.perf_counter()
        await session.create(model=model, messages=messages, max_tokens=4)
        s = session.stats[-1]
        rows.append(
            (
                turn + 1,
                s.prompt_tokens,
                s.reused_tokens,
                s.rotated_tokens,
                s.prefilled_tokens,
                (time.perf_counter() - t0) * 1e3,
            )
        )
        messages += agent_turn(turn)
        progress("leyline (amortize)", turn + 1, turns)
    await client.aclose()
    return rows


async def run_plain(url: str, turns: int, model: str) -> list[Row]:
    """The same agent and policies through a plain OpenAI client (the prefix cache only)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages, sticky, rows = [SYSTEM, TASK], {}, []
    for turn in range(turns):
        effective, sticky, _ = run_policies(messages, [TruncateOlderThanN(2)], TOOLS, sticky=sticky)
        t0 = time.perf_counter()
        r = await client.chat.completions.create(model=model, messages=effective, tools=TOOLS, max_tokens=4)
        cached = r.usage.prompt_tokens_details.cached_tokens
        rows.append(
            (
                turn + 1,
                r.usage.prompt_tokens,
                cached,
                0,
                r.usage.prompt_tokens - cached,
                (time.perf_counter() - t0) * 1e3,
            )
        )
        messages += agent_turn(turn)
        progress("plain re-prefill", turn + 1, turns)
    return rows


def table(leyline: list[Row], plain: list[Row]) -> None:
    """Per-turn comparison and totals."""
    print(
        f"\n{'turn':>4} | {'prompt':>6} {'reused':>6} {'rotated':>7} {'prefill':>7} {'ms':>6} |"
        f" {'prompt':>6} {'reused':>6} {'prefill':>7} {'ms':>6}"
    )
    print(f"{'':>4} | {'Leyline (amortize)':^36} | {'plain re-prefill':^29}")
    for a, b in zip(leyline, plain, strict=True):
        left = f"{a[0]:4d} | {a[1]:6d} {a[2]:6d} {a[3]:7d} {a[4]:7d} {a[5]:6.0f}"
        print(f"{left} | {b[1]:6d} {b[2]:6d} {b[4]:7d} {b[5]:6.0f}")
    la, pa = sum(r[4] for r in leyline), sum(r[4] for r in plain)
    lt, pt = sum(r[5] for r in leyline), sum(r[5] for r in plain)
    print(f"\nprefilled tokens: Leyline {la:,} vs plain {pa:,}  ({pa / max(la, 1):.1f}x fewer with Leyline)")
    print(f"rotated instead of recomputed: {sum(r[3] for r in leyline):,} tokens")
    print(f"wall time: Leyline {lt / 1e3:.2f} s vs plain {pt / 1e3:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--model", default="tiny-mla")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    print(
        f"model {args.model} ({args.layers} layers, random weights, CPU); policy TruncateOlderThanN(2); "
        f"{args.turns} agent turns"
    )
    settings = dict(model=args.model, layers=args.layers, kv_budget_mb=128, max_context_tokens=60_000)
    with serve_in_thread(local_service(**settings)) as url:
        leyline = asyncio.run(run_leyline(url, args.turns, args.model))
    with serve_in_thread(local_service(**settings)) as url:
        plain = asyncio.run(run_plain(url, args.turns, args.model))
    table(leyline, plain)


if __name__ == "__main__":
    main()
