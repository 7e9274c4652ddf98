"""Replay tool-heavy agent traces over HTTP: cache off vs radix prefix cache vs Leyline splice.

    .venv/bin/python benchmarks/bench_replay.py [--model smollm2-135m] [--sessions 8] [--turns 6]
        [--concurrency 1 4 8] [--trace tools|reasoning] [--png docs/results/replay.png]
    # the radix and leyline arms through the SGLang engine on this CPU (its venv and test stand-ins):
    PYTHONPATH=tests/sglang/stubs .venv-sglang/bin/python benchmarks/bench_replay.py --engine sglang \
        --concurrency 1 --png ""

Every arm replays the same deterministic sessions under ``TruncateOlderThanN(2)`` against a
fresh in-process server, ``concurrency`` sessions at a time. Traces: ``tools``
(``tool_traces.agent_session``: reads, re-reads, greps, failing runs) or ``reasoning``
(``traces.reasoning_agent_trace`` on a template that strips earlier reasoning at each new query,
installed on the model's tokenizer). Arms:

* **cache off** — the server recomputes every prompt (``prefix_cache=False``);
* **radix** — policies applied client-side, a plain OpenAI client: the radix prefix cache reuses
  the prompt up to the first evicted output (the re-prefill baseline);
* **client edits** — the same plain client, the policy's edits now *its own*, with the opt-in
  header ``X-Leyline-Client-Edits: amortize`` and a ``prompt_cache_key`` per session (as Codex
  sends): the server recognises each conversation after the edit and splices it;
* **leyline** — ``AsyncLeyline`` with the same policy: evictions are spliced in place.

``--engine sglang`` runs the radix and leyline arms against ``leyline-server --engine sglang`` on
this CPU (``tests/sglang/cpu_server``: SGLang's torch-native layers, one thread; a fresh server
per arm, its launch not timed). SGLang keeps its radix cache on (a splice lives there), so there
is no cache-off arm; these are CPU numbers of a GPU engine.

Reported per arm: replay cache hit (reused + rotated prompt tokens over prompt tokens, after
each session's first turn), the physical maximum for the same trace (every prompt token that
existed in the previous prompt and is not a stub: everything but stubs and new turns),
prefilled tokens, and p50/p90 time to first token and end to end (streamed, 8 tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.sglang.cpu_server, for --engine sglang

import openai  # noqa: E402
import tool_traces  # noqa: E402
import traces  # noqa: E402

from leyline_policies import TruncateOlderThanN, run_policies  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_sdk.explain.diff import diff_token_sequences  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402

ARMS = ("cache off", "radix", "client edits", "leyline")
CLIENT_EDITS = {"X-Leyline-Client-Edits": "amortize"}


@dataclass
class Turn:
    """One replayed request."""

    first: bool
    prompt: int
    cached: int
    prefilled: int
    ttft: float
    e2e: float
    fallback: str | None = None


async def _plain_turn(
    client: openai.AsyncOpenAI, model: str, messages: list[dict], tools: list[dict], **extra: Any
) -> tuple[int, int, int, float, float]:
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model, messages=messages, tools=tools, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, **extra,
    )  # fmt: skip
    ttft, usage, ext = None, None, {}
    async for chunk in stream:
        ttft = ttft if ttft is not None else time.perf_counter() - started
        usage = chunk.usage or usage
        ext = getattr(chunk, "leyline", None) or ext
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    prefilled = ext.get("prefilled_tokens", usage.prompt_tokens - cached)
    return usage.prompt_tokens, cached, prefilled, ttft or 0.0, time.perf_counter() - started


@dataclass(frozen=True)
class Trace:
    """One session: the full message list of each of its requests, and the tools offered."""

    requests: list[list[dict]]
    tools: list[dict]
    name: str = ""


def tool_trace(seed: int, turns: int) -> Trace:
    """A tool-heavy session (see ``tool_traces``), tool outputs capped at 4k characters.

    With the cap, the two most recent outputs (``TruncateOlderThanN(2)``) and the stubs fit
    SmolLM2's 8,192-token context (code-like text is ~2 characters per token there).
    """
    session = tool_traces.agent_session(seed, turns, max_chars=4000)
    requests, messages = [], list(session.opening)
    for step in [*session.turns, None]:
        requests.append(list(messages))
        messages += step or []
    return Trace(requests, tool_traces.TOOLS, f"tools-{seed}")


def reasoning_trace(seed: int, turns: int) -> Trace:
    """A reasoning agent's session (see ``traces``)."""
    steps = traces.reasoning_agent_trace(turns=turns, seed=seed, output_lines=20)
    return Trace([traces.messages_at(steps, t) for t in range(len(steps))], traces.TOOLS, f"reasoning-{seed}")


async def replay_plain(
    url: str, model: str, trace: Trace, headers: dict[str, str] | None = None, named: bool = False
) -> list[Turn]:
    """One session through a plain OpenAI client, the policy applied client-side (``headers`` on
    every request; ``named``: the trace's name as its ``prompt_cache_key``)."""
    policy, sticky, out = TruncateOlderThanN(2), {}, []
    extra = {"prompt_cache_key": trace.name} if named else {}
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, default_headers=headers) as client:
        for i, messages in enumerate(trace.requests):
            effective, sticky, _ = run_policies(messages, [policy], trace.tools, sticky=sticky)
            prompt, cached, prefilled, ttft, e2e = await _plain_turn(client, model, effective, trace.tools, **extra)
            out.append(Turn(i == 0, prompt, cached, prefilled, ttft, e2e))
    return out


async def replay_leyline(url: str, model: str, trace: Trace, **options: Any) -> list[Turn]:
    """One session through :class:`AsyncLeyline` (``options``: more constructor arguments)."""
    out = []
    async with AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)], **options) as client:
        session = client.session(tools=trace.tools)
        for i, messages in enumerate(trace.requests):
            started = time.perf_counter()
            stream = await session.create(
                model=model, messages=messages, max_tokens=8, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            ttft = None
            async for _ in stream:
                ttft = ttft if ttft is not None else time.perf_counter() - started
            s = session.stats[-1]
            cached = s.reused_tokens + s.rotated_tokens
            out.append(Turn(i == 0, s.prompt_tokens, cached, s.prefilled_tokens, ttft or 0.0,
                            time.perf_counter() - started, s.fallback))  # fmt: skip
    return out


def physical_maximum(chat: Any, sessions: list[Trace]) -> float:
    """Reusable share of prompt tokens after the first turn: all but stubs and new turns."""
    reusable = total = 0
    for trace in sessions:
        policy, sticky, previous = TruncateOlderThanN(2), {}, None
        for messages in trace.requests:
            effective, sticky, _ = run_policies(messages, [policy], trace.tools, sticky=sticky)
            tokens = chat.render(effective, tools=trace.tools).tokens
            if previous is not None:
                changed = sum(len(d.replacement) for d in diff_token_sequences(previous, tokens))
                reusable += len(tokens) - changed
                total += len(tokens)
            previous = tokens
    return reusable / max(total, 1)


async def replay_all(
    replay: Callable[[Trace], Awaitable[list[Turn]]], sessions: list[Trace], concurrency: int
) -> list[Turn]:
    """``replay`` every trace, ``concurrency`` at a time; every turn, in session order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(trace: Trace) -> list[Turn]:
        async with gate:
            return await replay(trace)

    results = await asyncio.gather(*(one(t) for t in sessions))
    return [turn for turns in results for turn in turns]


async def run_arm(arm: str, url: str, model: str, sessions: list[Trace], concurrency: int) -> list[Turn]:
    """Replay every trace through ``arm``'s client, ``concurrency`` at a time."""
    if arm == "leyline":
        return await replay_all(lambda trace: replay_leyline(url, model, trace), sessions, concurrency)
    if arm == "client edits":
        return await replay_all(
            lambda trace: replay_plain(url, model, trace, CLIENT_EDITS, named=True), sessions, concurrency
        )
    return await replay_all(lambda trace: replay_plain(url, model, trace), sessions, concurrency)


def summary(turns: list[Turn]) -> dict[str, float]:
    """Hit after the first turns, prefilled tokens, latency percentiles."""
    later = [t for t in turns if not t.first]

    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=10)[int(q * 10) - 1] if len(values) > 1 else values[0]

    ttft, e2e = [t.ttft * 1e3 for t in turns], [t.e2e * 1e3 for t in turns]
    return {
        "hit": sum(t.cached for t in later) / max(sum(t.prompt for t in later), 1),
        "prefilled": sum(t.prefilled for t in turns),
        "ttft50": statistics.median(ttft), "ttft90": pct(ttft, 0.9),
        "e2e50": statistics.median(e2e), "e2e90": pct(e2e, 0.9),
    }  # fmt: skip


def plot(rows: list[tuple[int, str, dict[str, float]]], physical: float, path: str) -> None:
    """Replay hit and p50 TTFT per concurrency and arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    levels = sorted({c for c, _, _ in rows})
    arms = [a for a in ARMS if any(r[1] == a for r in rows)]
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        xs = [i + k * width for i in range(len(levels))]
        left.bar(xs, [s["hit"] * 100 for c, a, s in rows if a == arm], width, label=arm)
        right.bar(xs, [s["ttft50"] for c, a, s in rows if a == arm], width, label=arm)
    left.axhline(physical * 100, color="black", linestyle="--", label="physical max")
    for ax, title in ((left, "replay cache hit (%)"), (right, "p50 time to first token (ms)")):
        ax.set_xticks([i + width for i in range(len(levels))], [f"C={c}" for c in levels])
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


@contextlib.contextmanager
def sglang_server(model: str, kv_budget_mb: float, context: int) -> Iterator[str]:
    """``leyline-server --engine sglang`` on this CPU serving ``model`` (a pool of ``kv_budget_mb``
    at SmolLM2's ~46 KB per token); yields its URL."""
    import tempfile

    from leyline_server.local import free_port
    from tests.sglang.cpu_server import SGLangServer, checkpoint

    pool = int(kv_budget_mb * 2**20 / 46080)
    extra = ["--served-model-name", model, "--max-total-tokens", str(pool), "--context-length", str(context)]
    log = Path(tempfile.mkdtemp(prefix="replay-sglang-")) / "server.log"
    srv = SGLangServer(checkpoint(model), free_port(), log, extra=extra)
    print(f"  sglang launched in {srv.launch_s:.1f} s", file=sys.stderr)
    try:
        yield srv.url
    finally:
        srv.stop()


def sglang_chat(model: str) -> Any:
    """The chat renderer of ``model``'s checkpoint (for the physical maximum)."""
    from transformers import AutoTokenizer

    from leyline_sdk.render.rendering import HFChatTokenizer
    from tests.sglang.cpu_server import checkpoint

    return HFChatTokenizer(AutoTokenizer.from_pretrained(str(checkpoint(model))))


def arm_server(engine: str, arm: str, args: argparse.Namespace) -> Any:
    """A fresh server for ``arm`` (a context manager yielding its URL) and its chat renderer."""
    if engine == "sglang":
        return sglang_server(args.model, args.kv_budget_mb, args.context), None
    service = local_service(
        args.model, kv_budget_mb=args.kv_budget_mb, max_context_tokens=args.context, default_max_tokens=8,
        prefix_cache=arm != "cache off",
    )  # fmt: skip
    if args.trace == "reasoning":
        service.tokenizer.chat_template = traces.REASONING_TEMPLATE
    return serve_in_thread(service), service.chat


def main() -> None:
    """Run every arm at every concurrency and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a preset or checkpoint (tiny-mla for a quick run)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--kv-budget-mb",
        type=float,
        default=2048,
        help="KV pool: room for every session in flight at C = 8 (SmolLM2: ~46 KB per token)",
    )
    parser.add_argument("--context", type=int, default=8192, help="the server's context limit")
    parser.add_argument("--trace", choices=("tools", "reasoning"), default="tools")
    parser.add_argument("--png", default="docs/results/replay.png")
    parser.add_argument("--engine", choices=("embedded", "sglang"), default="embedded")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    args = parser.parse_args()
    if args.engine == "sglang" and args.trace == "reasoning":
        parser.error("--engine sglang replays the tools trace (the reasoning template is set in-process)")
    arms = [a for a in args.arms if args.engine == "embedded" or a != "cache off"]
    make = tool_trace if args.trace == "tools" else reasoning_trace
    sessions = [make(seed, args.turns) for seed in range(args.sessions)]
    rows, physical = [], None
    for concurrency in args.concurrency:
        for arm in arms:
            served, chat = arm_server(args.engine, arm, args)
            if physical is None:
                physical = physical_maximum(chat or sglang_chat(args.model), sessions)
            with served as url:
                t0 = time.perf_counter()
                turns = asyncio.run(run_arm(arm, url, args.model, sessions, concurrency))
            rows.append((concurrency, arm, summary(turns)))
            print(f"C={concurrency} {arm}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    requests = sum(len(t.requests) for t in sessions)
    head = f"{args.trace} trace: {args.sessions} sessions, {requests} requests, model {args.model}"
    head += ", engine sglang on this CPU (CPU numbers of a GPU engine)" if args.engine == "sglang" else ""
    print(head + ", TruncateOlderThanN(2)\n")
    print("| C | arm | replay hit | physical max | prefilled tokens | TTFT p50 ms | TTFT p90 ms | e2e p50 | e2e p90 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for concurrency, arm, s in rows:
        print(
            f"| {concurrency} | {arm} | {s['hit']:.1%} | {physical:.1%} | {s['prefilled']:,.0f} | {s['ttft50']:.0f} | "
            f"{s['ttft90']:.0f} | {s['e2e50']:.0f} | {s['e2e90']:.0f} |"
        )
    if args.png:
        plot(rows, physical or 0.0, args.png)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
