"""Leyline against llama.cpp's own server, on the same GGUF, the same machine, through the same door.

    make peer    # builds llama-server from the llama.cpp that llama-cpp-python vendors (~8 minutes)
    .venv/bin/python benchmarks/bench_vs_llama_server.py [--model smollm2-135m] [--rounds 3] \
        [--downstream 1000,4000] [--cache-reuse 0,256] [--md docs/results/tables/vs_llama_server.md]

Both servers run as a user starts them (llama-server: its defaults, ``--jinja``, ``--cache-reuse N``;
Leyline: the llama.cpp engine with its defaults) and are driven over ``/v1/chat/completions``,
greedy, streamed, alternating server by server in every round (the table gives medians over rounds
and the range). Columns:

* **cold prefill** — a ~6k-token prompt nobody has seen, time to its first token;
* **decode, 1 stream** — 48 tokens (``ignore_eos``) after a short prompt, tokens per second after
  the first; **decode, 8 streams** — eight at once, all tokens over the wall time (llama-server
  with ``-np 8``);
* **edits** — an agent's conversation: a chat head, an old tool output (~1.5k tokens), ``D``
  downstream tokens of conversation, a question (answered, 1 token). Then the same conversation
  with the tool output **replaced by a stub** or **deleted** (with the assistant line that asked
  for it), and a new question: time to its first token. Leyline gets the opt-in header
  ``X-Leyline-Client-Edits: amortize`` (a plain client's edit, spliced); llama-server its
  ``--cache-reuse``. On each freshly started server the first edit is a deletion (**first after
  start**), then a stub, then a deletion again (**warm**).
* **agreement** — each edited turn's first 16 greedy tokens against the same request recomputed
  from scratch on the same server (Leyline: ``X-Leyline-Client-Edits: exact``; llama-server:
  ``cache_prompt: false``): first token equal, and all 16 equal, over the edits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peer_servers import MODEL, chat, decode_rate, gguf_of, leyline, llama_server  # noqa: E402

DOC = (ROOT / "docs" / "design.md").read_text(encoding="utf-8") + (ROOT / "docs" / "server.md").read_text(
    encoding="utf-8"
)
AMORTIZE = {"X-Leyline-Client-Edits": "amortize"}
EXACT = {"X-Leyline-Client-Edits": "exact"}
Server = Callable[[int], AbstractContextManager[str]]  # streams -> a running server's URL


def text_of(tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of this repo's docs (3.4 characters a token), from a seed-chosen place."""
    chars = int(tokens * 3.4)
    start = (seed * 7919) % max(1, len(DOC) - chars) if len(DOC) > chars else 0
    body = (DOC * (1 + chars // len(DOC)))[start : start + chars]
    return body


def conversation(k: int, downstream: int) -> list[dict[str, str]]:
    """Conversation ``k``: head, the old tool output (message 3), ``downstream`` tokens of turns."""
    output = "\n".join(f"line {i}: value_{i} = compute({(i * 7919 + k) % 10007})" for i in range(100))
    msgs = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix the bug in module_{k}.py."},
        {"role": "assistant", "content": "Reading the file."},
        {"role": "user", "content": f"Tool output:\n{output}"},
    ]
    turns = max(1, downstream // 500)
    for t in range(turns):
        msgs.append({"role": "assistant", "content": text_of(250, k * 31 + t)})
        msgs.append({"role": "user", "content": text_of(250, k * 37 + t + 1)})
    msgs.append({"role": "user", "content": "Which function should change first?"})
    return _merged(msgs)


def _merged(msgs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Adjacent messages of one role joined (the templates want turns to alternate)."""
    out: list[dict[str, str]] = []
    for m in msgs:
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(dict(m))
    return out


def edited(msgs: list[dict[str, str]], reply: str, kind: str) -> list[dict[str, str]]:
    """The next turn after an edit: the tool output stubbed or deleted, the reply kept, a new question."""
    out = [dict(m) for m in msgs]
    if kind == "stub":
        out[3]["content"] = "Tool output:\n[tool output elided: 100 lines]"
    else:
        del out[2:4]
    out += [{"role": "assistant", "content": reply or "."}, {"role": "user", "content": "And after that?"}]
    return _merged(out)


def edit_turns(url: str, leyline_side: bool, downstream: int, k: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """On one fresh server: deletion (first after start), stub, deletion (warm); each timed and agreed."""
    fresh = EXACT if leyline_side else None
    for n, kind in enumerate(("delete", "stub", "delete")):
        msgs = conversation(k * 10 + n, downstream)
        first = chat(url, msgs, 1, headers=AMORTIZE if leyline_side else None)
        nxt = edited(msgs, first["text"], kind)
        timed = chat(url, nxt, 16, headers=AMORTIZE if leyline_side else None)
        oracle = chat(url, nxt, 16, extra=None if leyline_side else {"cache_prompt": False}, headers=fresh)
        label = "first" if n == 0 else "warm"
        timed["agree"] = (timed["text"][:1] == oracle["text"][:1], timed["text"] == oracle["text"])
        timed["downstream"] = int(first["usage"].get("prompt_tokens", 0))
        yield f"{kind} ({label})", timed


def cold_prefill(url: str, k: int) -> float:
    """Seconds to the first token of a ~6k-token prompt this server has not seen."""
    msgs = [{"role": "user", "content": f"Summary {k}, please:\n" + text_of(5900, 100 + k)}]
    return float(chat(url, msgs, 1)["ttft"])


def decode(url: str, streams: int, k: int) -> float:
    """Tokens per second of ``streams`` concurrent 48-token answers (one stream: after its first token)."""
    msgs = [[{"role": "user", "content": f"Tell story {k}-{i} about a lighthouse."}] for i in range(streams)]
    extra = {"ignore_eos": True}
    if streams == 1:
        return decode_rate(chat(url, msgs[0], 48, extra=extra))
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda m: chat(url, m, 48, extra=extra), msgs))
    tokens = sum(int(r["usage"].get("completion_tokens") or len(r["times"])) for r in results)
    return tokens / max(r["total"] for r in results)


def round_of(name: str, server: Server, downstream: list[int], r: int, parts: set[str]) -> dict[str, list[Any]]:
    """One round of the ``parts`` asked for on ``server`` (fresh processes), keyed by column."""
    out: dict[str, list[Any]] = defaultdict(list)
    side = name.startswith("leyline")
    if parts & {"cold", "decode"}:
        with server(1) as url:
            decode(url, 1, 999)  # warm-up: the first request pays one-time set-up
            if "cold" in parts:
                out["cold prefill (s)"].append(cold_prefill(url, r))
            if "decode" in parts:
                out["decode, 1 stream (tok/s)"].append(decode(url, 1, r))
    if "decode8" in parts:
        with server(8) as url:
            decode(url, 8, 998)
            out["decode, 8 streams (tok/s)"].append(decode(url, 8, r))
    for d in downstream if "edits" in parts else []:
        with server(1) as url:
            for label, timed in edit_turns(url, side, d, r):
                out[f"{label}, ~{d} downstream (s)"].append(timed["ttft"])
                out["agreement"].append(timed["agree"])
    return out


def table(results: dict[str, dict[str, list[Any]]], model: str) -> str:
    """The markdown table: medians (min–max) per server and column, agreement counts last."""
    names = list(results)
    cols = [c for c in results[names[0]] if c != "agreement"]
    lines = [f"Model `{model}`; medians over rounds (min–max).", "",
             "| column | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]  # fmt: skip
    for c in cols:
        cells = []
        for n in names:
            v = results[n].get(c, [])
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})" if v else "—")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    agree = []
    for n in names:
        a = results[n].get("agreement", [])
        agree.append(f"first token {sum(x[0] for x in a)}/{len(a)}, 16 tokens {sum(x[1] for x in a)}/{len(a)}")
    if any(results[n].get("agreement") for n in names):
        lines.append("| agreement with a fresh prefill | " + " | ".join(agree) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the rounds, print the table, write it to ``--md``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--downstream", default="1000,4000", help="downstream tokens of the edit columns")
    ap.add_argument("--cache-reuse", default="256", help="llama-server's --cache-reuse values, one arm each")
    ap.add_argument("--parts", default="cold,decode,decode8,edits", help="the columns to run")
    ap.add_argument("--leyline-flags", default="", help="extra leyline-server flags (space-separated)")
    ap.add_argument("--peer-flags", default="", help="extra llama-server flags (space-separated)")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "results" / "tables" / "vs_llama_server.md")
    args = ap.parse_args()
    gguf, log = gguf_of(args.model), Path("/tmp/bench_vs_llama_server.log")
    MODEL["name"] = args.model
    downstream = [int(x) for x in args.downstream.split(",")]
    servers: dict[str, Server] = {
        "leyline": lambda s: leyline(args.model, args.context, s, log, args.leyline_flags.split()),
    }
    peer = args.peer_flags.split()
    for n in (int(x) for x in args.cache_reuse.split(",")):
        servers[f"llama-server --cache-reuse {n}"] = lambda s, n=n: llama_server(gguf, args.context, s, n, log, peer)
    results: dict[str, dict[str, list[Any]]] = {name: defaultdict(list) for name in servers}
    for r in range(args.rounds):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        for name in order:
            print(f"round {r + 1}/{args.rounds}: {name}", flush=True)
            for col, values in round_of(name, servers[name], downstream, r, set(args.parts.split(","))).items():
                results[name][col].extend(values)
    md = table(results, args.model)
    print(md)
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(md, encoding="utf-8")


if __name__ == "__main__":
    main()
