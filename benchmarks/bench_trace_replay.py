"""Replay a recorded agent session (``record_agent_trace.py``) against fresh servers, three ways.

    .venv/bin/python benchmarks/bench_trace_replay.py [--trace benchmarks/traces/codex_session.jsonl] \
        [--model qwen2.5-coder-0.5b] [--md docs/results/tables/agent_trace.md]

Each recorded ``/v1/responses`` body is posted in order, streamed as Codex streams it, with its
output cut to 8 tokens (the recorded session already holds the model's real answers: what is
measured is the cost of each prompt), to a fresh server on ``--model`` (llama.cpp engine, 32k
context) per arm:

* **cache off** — every prompt recomputed (``--disable-prefix-cache``);
* **leyline** — the server as it starts: the prefix cache, and each conversation recognised and
  continued exactly (nothing spliced);
* **client edits** — the same, with Codex's opt-in header ``X-Leyline-Client-Edits: amortize``
  (``http_headers`` in its ``config.toml``): the history Codex rewrote itself is spliced.

Reported per arm: prompt tokens, tokens read from the cache (``cached_tokens``), the client's time
to the first output token, summed over the session and for the requests after each compaction.
The 0.5B and 1.5B Qwen2.5-Coder share one tokenizer, so a trace recorded on one replays token for
token on the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from leyline_server.local import local_service, serve_in_thread  # noqa: E402

ARMS = {
    "cache off": ({"prefix_cache": False}, {}),
    "leyline": ({}, {}),
    "client edits": ({}, {"X-Leyline-Client-Edits": "amortize"}),
}


def post(url: str, model: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, float]:
    """One recorded request, streamed: prompt and cached tokens, seconds to the first output token."""
    body = {**body, "model": model, "stream": True, "max_output_tokens": 8, "temperature": 0}
    start, first, usage = time.perf_counter(), None, {}
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=3600, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("type", "").endswith(".delta"):
                first = time.perf_counter() - start
            if event.get("type") in ("response.completed", "response.incomplete"):  # (8 tokens: incomplete)
                usage = event["response"]["usage"]
    details = usage.get("input_tokens_details") or {}
    return {"prompt": usage.get("input_tokens", 0), "cached": details.get("cached_tokens") or 0,
            "ttft": first if first is not None else time.perf_counter() - start}  # fmt: skip


def replay(bodies: list[dict[str, Any]], model: str, context: int) -> dict[str, list[dict[str, float]]]:
    """Every arm's per-request measurements, each arm on a fresh server."""
    out = {}
    for arm, (engine_flags, headers) in ARMS.items():
        service = local_service(model, engine="llamacpp", kv_budget_mb=1024, max_context_tokens=context, **engine_flags)
        with serve_in_thread(service) as url:
            out[arm] = [post(url, model, body, headers) for body in bodies]
        print(f"{arm}: {sum(m['cached'] for m in out[arm]):,} of {sum(m['prompt'] for m in out[arm]):,} cached")
    return out


def rewritten(bodies: list[dict[str, Any]]) -> list[int]:
    """The requests whose input does not extend the previous one's (Codex rewrote its history)."""
    marks, previous = [], None
    for i, body in enumerate(bodies):
        items = json.dumps(body.get("input"))[:-1]
        if previous is not None and not items.startswith(previous):
            marks.append(i)
        previous = items
    return marks


def table(results: dict[str, list[dict[str, float]]], edits: list[int], model: str, trace: str) -> str:
    lines = [f"<!-- .venv/bin/python benchmarks/bench_trace_replay.py --trace {trace} --model {model} -->",
             "| arm | prompt tokens | read from cache | time to first token (sum) | after Codex rewrote its history: "
             "cached / prompt, time to first token |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for arm, rows in results.items():
        after = [rows[i] for i in edits]
        edit = (f"{sum(m['cached'] for m in after):,} / {sum(m['prompt'] for m in after):,}, "
                f"{sum(m['ttft'] for m in after):.1f} s") if after else "no rewrite"  # fmt: skip
        lines.append(f"| {arm} | {sum(m['prompt'] for m in rows):,} | {sum(m['cached'] for m in rows):,} | "
                     f"{sum(m['ttft'] for m in rows):.1f} s | {edit} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trace", default="benchmarks/traces/codex_session.jsonl")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--requests", type=int, default=0, help="replay only the first N requests (0: all)")
    parser.add_argument("--md", default=str(ROOT / "docs" / "results" / "tables" / "agent_trace.md"))
    args = parser.parse_args()
    bodies = [json.loads(line) for line in (ROOT / args.trace).read_text().splitlines() if line.strip()]
    bodies = bodies[: args.requests or None]
    edits = rewritten(bodies)
    print(f"{len(bodies)} requests; history rewritten before requests {[i + 1 for i in edits]}")
    md = table(replay(bodies, args.model, args.context), edits, args.model, args.trace)
    print(md)
    Path(args.md).write_text(md)


if __name__ == "__main__":
    main()
