"""Tool calls as real models write them: the share of answers that come back as valid calls.

    .venv/bin/python benchmarks/bench_tool_calls.py [--models qwen2.5-coder-0.5b qwen2.5-coder-1.5b]
        [--protocols chat responses messages] [--stream both] [--md docs/results/tables/tool_calls.md]

For each model (a real preset on the llama.cpp engine, greedy) a server runs in-process on a
loopback port, and every prompt of ``benchmarks/tool_call_cases.py`` (24 prompts: one tool,
several tools, a required call, nested arguments) is asked through each protocol with that
protocol's own client (openai for Chat Completions and the Responses API, anthropic for the
Messages API), not streamed and streamed. An answer is *valid* when the client's parsed answer
holds at least one call, each naming an offered tool with arguments that validate against its
schema; *framing* counts answers whose shown text still holds call syntax (must be 0).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tool_call_cases import CASES, PROTOCOLS, ask, judge

from leyline_server.local import local_service, serve_in_thread


def run_model(model: str, protocols: list[str], streams: list[bool], cases: int, engine: str) -> list[dict[str, Any]]:
    """Every case on every protocol and stream mode against one fresh server; one row per answer."""
    import anthropic
    import openai

    service = local_service(model, engine=engine, kv_budget_mb=1024, max_context_tokens=8192, default_max_tokens=256)
    rows = []
    with serve_in_thread(service) as url:
        clients = {
            "openai": openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600),
            "anthropic": anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=600),
        }
        for protocol in protocols:
            for stream in streams:
                for case in CASES[:cases]:
                    start = time.perf_counter()
                    answer = ask(clients, protocol, model, case, stream)
                    verdict = judge(case, answer)
                    rows.append(
                        {"model": model, "protocol": protocol, "stream": stream, "case": case.name, **verdict,
                         "seconds": time.perf_counter() - start, "calls": answer.calls, "text": answer.text[:300]}
                    )  # fmt: skip
                    mark = "ok " if verdict["valid"] else "BAD"
                    where = f"{model} {protocol:9} stream={stream!s:5} {case.name:16}"
                    print(f"  {mark} {where} {answer.calls} {answer.text[:80]!r}")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: valid calls, framing in the text and the expected tool, per model, protocol and stream mode."""
    lines = [
        "| model | protocol | streamed | valid calls | framing in text | expected tool | s/answer |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    keys = sorted(
        {(r["model"], r["protocol"], r["stream"]) for r in rows}, key=lambda k: (k[0], PROTOCOLS.index(k[1]), k[2])
    )
    for model, protocol, stream in keys:
        group = [r for r in rows if (r["model"], r["protocol"], r["stream"]) == (model, protocol, stream)]
        n = len(group)
        valid, framing, expected = (sum(r[k] for r in group) for k in ("valid", "framing", "expected"))
        secs = sum(r["seconds"] for r in group) / n
        lines.append(
            f"| {model} | {protocol} | {'yes' if stream else 'no'} | {valid}/{n} ({100 * valid / n:.0f} %) "
            f"| {framing} | {expected}/{n} | {secs:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--stream", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--cases", type=int, default=len(CASES), help="the first N cases only")
    parser.add_argument("--engine", default="llamacpp")
    parser.add_argument("--md", default="", help="also write the table (and the answers, as JSON) here")
    args = parser.parse_args()
    streams = {"no": [False], "yes": [True], "both": [False, True]}[args.stream]
    start = time.perf_counter()
    rows = [r for m in args.models for r in run_model(m, args.protocols, streams, args.cases, args.engine)]
    out = table(rows)
    print(out)
    print(f"\n{len(rows)} answers in {time.perf_counter() - start:.0f} s")
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(out + "\n")
        with open(args.md.rsplit(".", 1)[0] + ".json", "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
