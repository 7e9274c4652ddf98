"""The SGLang engine on this CPU, beside the embedded and llama.cpp engines, all measured over HTTP.

    # SGLang (its venv, the CPU stand-ins of tests/sglang; one OpenMP thread):
    SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 PYTHONPATH=tests/sglang/stubs \\
        .venv-sglang/bin/python benchmarks/bench_sglang_cpu.py --engine sglang
    # the embedded and llama.cpp engines (main venv), the same measurements:
    .venv/bin/python benchmarks/bench_sglang_cpu.py --engine embedded llamacpp

SGLang is a GPU engine: these are CPU numbers of a GPU engine (torch-native layers, no CUDA
graphs, no FlashInfer), to compare the engines' splice paths, not SGLang's speed. SmolLM2-135M-
Instruct on every engine (SGLang and embedded: float32 weights from the GGUF; llama.cpp: the
Q4_1 GGUF itself). Each server is started fresh; every number is the best of ``--repeats``.

* **prefill / decode** — a 1,024-token prompt from nothing (tok/s to its first token), then the
  decode speed of up to 64 greedy tokens after it (streamed; first to last token).
* **splice vs forget** — an agent's context: a chat head, an old ~420-token tool output, then
  ``D`` downstream tokens (this repo's design document) and a new question. The tool output is
  replaced by a stub; measured is the time from the edited request to its first token, with the
  edit as ``amortize`` (a splice) and as ``forget`` (everything after the edit re-prefilled),
  each on a freshly opened session; the ratio is forget / splice of the same run.
* **splice_ms against its limit** — the server's ``splice_ms`` of the splice above, and its
  limit: the replacement's prefill (the ``splice_ms`` of a splice that moves nothing: the stub
  appended at the session's end, same engine path) plus a copy of the moved rows (``D`` rows of
  every layer's K and V, torch ``index_copy`` on this CPU with the server's thread count).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL = "smollm2-135m"
TOOL = "\n".join(f"line {i}: value_{i} = compute({i * 7919 % 10007})" for i in range(30))
STUB = "[tool output elided: 30 lines]"
# SmolLM2's shape, for the copy of the moved rows: layers, KV heads, head dim, float32
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


@contextlib.contextmanager
def server(engine: str, pool_tokens: int) -> Iterator[str]:
    """A fresh server of SmolLM2 on ``engine``; yields its URL."""
    if engine == "sglang":
        import tempfile

        from leyline_server.local import free_port
        from tests.sglang.cpu_server import SGLangServer, checkpoint

        log = Path(tempfile.mkdtemp(prefix="bench-sglang-")) / "server.log"
        extra = ["--served-model-name", MODEL, "--max-total-tokens", str(pool_tokens)]
        srv = SGLangServer(checkpoint(MODEL), free_port(), log, extra=extra)
        print(f"  sglang launched in {srv.launch_s:.1f} s", file=sys.stderr)
        try:
            yield srv.url
        finally:
            srv.stop()
        return
    import asyncio

    from leyline_server.local import local_service, serve_in_thread

    mb = pool_tokens * LAYERS * KV_HEADS * HEAD_DIM * 2 * 4 / 2**20
    service = local_service(MODEL, engine=engine, kv_budget_mb=mb, max_context_tokens=8192)
    with serve_in_thread(service) as url:
        yield url
    asyncio.run(service.shutdown())


class Bench:
    """The measurements, over one server's HTTP API."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=600)
        self.doc = (ROOT / "docs" / "design.md").read_text(encoding="utf-8") * 3
        self.runs = itertools.count()

    def tokens(self, messages: list[dict[str, str]], prompt: bool = False) -> tuple[list[int], list[dict]]:
        r = self.http.post("/v1/leyline/tokenize", json={"messages": messages, "add_generation_prompt": prompt})
        body = r.json()
        return body["tokens"], body["message_spans"]

    def text_of(self, n: int, offset: int = 0) -> str:
        """Design-document text of about ``n`` tokens (starting ``offset`` characters in)."""
        lo, hi = 0, len(self.doc) - offset
        while hi - lo > 8:
            mid = (lo + hi) // 2
            got = len(self.tokens([{"role": "user", "content": self.doc[offset : offset + mid]}])[0])
            lo, hi = (mid, hi) if got < n else (lo, mid)
        return self.doc[offset : offset + lo]

    def stream(self, body: dict[str, Any]) -> dict[str, Any]:
        """A streamed chat completion: time to first token, token times, the ``leyline`` report."""
        started = time.perf_counter()
        stamps, report = [], None
        with self.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    stamps.append(time.perf_counter())
                report = chunk.get("leyline") or report
        return {"ttft": (stamps[0] if stamps else time.perf_counter()) - started, "stamps": stamps, "report": report}

    def speed(self, repeats: int) -> tuple[float, float]:
        """(prefill tok/s of a 1,024-token prompt, decode tok/s of up to 64 tokens after it)."""
        prefill, decode = 0.0, 0.0
        for i in range(repeats):
            text = self.text_of(1000, offset=1500 * (i + 1))  # a prompt no cache holds
            messages = [{"role": "user", "content": text + "\nContinue this document."}]
            n = len(self.tokens(messages, prompt=True)[0])
            out = self.stream({"model": MODEL, "messages": messages, "max_tokens": 64, "temperature": 0})
            prefill = max(prefill, n / out["ttft"])
            stamps = out["stamps"]
            if len(stamps) > 8:
                decode = max(decode, (len(stamps) - 1) / (stamps[-1] - stamps[0]))
        return prefill, decode

    def agent(self, downstream: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """(the session's messages, the edited request's messages) for ``downstream`` tokens; each
        call's system message is new, so no run reuses another's cache (a forget would)."""
        head = [
            {"role": "system", "content": f"You are a coding agent (run {next(self.runs)})."},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": "Reading the file."},
        ]
        down = {"role": "user", "content": self.text_of(downstream)}
        base = [*head, {"role": "user", "content": "Tool output:\n" + TOOL}, down]
        edited = [*head, {"role": "user", "content": STUB}, down, {"role": "user", "content": "What next?"}]
        return base, edited

    def continue_after_edit(self, downstream: int, mode: str) -> dict[str, Any]:
        """Open a session on the agent's context, then send the edited request with the edit as ``mode``."""
        base, edited = self.agent(downstream)
        session = self.http.post("/v1/leyline/sessions", json={"messages": base}).json()
        spans = self.tokens(base)[1]
        new, new_spans = self.tokens(edited, prompt=True)
        old, stub = spans[3], new_spans[3]
        directive = {"start": old["start"], "end": old["end"], "replacement": new[stub["start"] : stub["end"]],
                     "mode": mode}  # fmt: skip
        ext = {"session_id": session["id"], "base": {"length": len(session["tokens"])}, "directives": [directive]}
        out = self.stream({"model": MODEL, "messages": edited, "max_tokens": 1, "temperature": 0, "leyline": ext})
        out["moved"] = len(session["tokens"]) - old["end"]
        out["replacement"] = directive["replacement"]
        self.http.delete(f"/v1/leyline/sessions/{session['id']}")
        return out

    def append_ms(self, downstream: int, replacement: list[int]) -> float:
        """``splice_ms`` of a splice that moves nothing: ``replacement`` appended at the session's end."""
        base, _ = self.agent(downstream)
        session = self.http.post("/v1/leyline/sessions", json={"messages": base}).json()
        n = len(session["tokens"])
        d = {"start": n, "end": n, "replacement": replacement}
        r = self.http.post(f"/v1/leyline/sessions/{session['id']}/directives", json={"directives": [d]}).json()
        self.http.delete(f"/v1/leyline/sessions/{session['id']}")
        assert r["applied"] and r["rotated_tokens"] == 0, r
        return float(r["splice_ms"])


def copy_ms(rows: int, threads: int, repeats: int = 5) -> float:
    """A plain copy of ``rows`` KV rows (K and V of every layer) between slots, in ms (best of ``repeats``)."""
    import torch

    torch.set_num_threads(threads)
    pool = rows * 2 + 16
    layers = [torch.randn(pool, KV_HEADS, HEAD_DIM) for _ in range(2 * LAYERS)]
    src, dst = torch.arange(rows), torch.arange(rows, 2 * rows)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for buf in layers:
            buf.index_copy_(0, dst, buf.index_select(0, src))
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def run(engine: str, downstream: list[int], repeats: int) -> dict[str, Any]:
    """Every measurement on a fresh server of ``engine``."""
    threads = 1 if engine == "sglang" else (os.cpu_count() or 2)
    result: dict[str, Any] = {"engine": engine, "threads": threads, "rows": []}
    with server(engine, pool_tokens=12288) as url:
        bench = Bench(url)
        bench.continue_after_edit(200, "amortize")  # warm up (first-use costs of every path)
        result["prefill"], result["decode"] = bench.speed(repeats)
        for d in downstream:
            splice = min((bench.continue_after_edit(d, "amortize") for _ in range(repeats)), key=lambda o: o["ttft"])
            forget = min((bench.continue_after_edit(d, "forget") for _ in range(repeats)), key=lambda o: o["ttft"])
            assert splice["report"]["applied"] and splice["report"]["rotated_tokens"] > 0, splice["report"]
            append = min(bench.append_ms(d, splice["replacement"]) for _ in range(repeats))
            copy = copy_ms(splice["moved"], threads)
            result["rows"].append({
                "downstream": d, "moved": splice["moved"], "replacement": len(splice["replacement"]),
                "splice_s": splice["ttft"], "forget_s": forget["ttft"], "splice_ms": splice["report"]["splice_ms"],
                "append_ms": append, "copy_ms": copy, "canary": splice["report"]["canary"],
            })  # fmt: skip
            print(f"  {engine} D={d}: splice {splice['ttft']:.2f} s, forget {forget['ttft']:.2f} s", file=sys.stderr)
    return result


def table(results: list[dict[str, Any]]) -> str:
    """The markdown tables."""
    lines = [
        "| engine | threads | prefill tok/s (1,024 tokens) | decode tok/s |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['engine']} | {r['threads']} | {r['prefill']:.0f} | {r['decode']:.1f} |")
    lines += [
        "",
        "| engine | downstream tokens | splice (s) | forget (s) | forget / splice | splice_ms | limit ms "
        "(prefill of the stub + copy of the moved rows) | splice_ms / limit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for row in r["rows"]:
            limit = row["append_ms"] + row["copy_ms"]
            lines.append(
                f"| {r['engine']} | {row['moved']:,} | {row['splice_s']:.2f} | {row['forget_s']:.2f} | "
                f"{row['forget_s'] / row['splice_s']:.1f}x | {row['splice_ms']:.0f} | "
                f"{limit:.0f} ({row['append_ms']:.0f} + {row['copy_ms']:.0f}) | {row['splice_ms'] / limit:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    """Measure each engine named, print the tables (and the raw numbers as JSON to stderr)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", nargs="+", default=["sglang"], choices=("sglang", "embedded", "llamacpp"))
    parser.add_argument("--downstream", default="1000,4000", help="downstream tokens after the edited tool output")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    results = [run(e, [int(d) for d in args.downstream.split(",")], args.repeats) for e in args.engine]
    print(json.dumps(results), file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"SmolLM2-135M-Instruct, {os.cpu_count()} cores, best of {args.repeats}; load average {load:.1f}; "
          f"{time.perf_counter() - started:.0f} s in all\n")  # fmt: skip
    print(table(results))


if __name__ == "__main__":
    main()
