"""Serving concurrency on the CPU engines: batched decode, the turn after an edit, a neighbour's first token.

    .venv/bin/python benchmarks/bench_concurrency.py [--engines llamacpp embedded] [--concurrency 1 2 4 8]
        [--tokens 128] [--rounds 3] [--downstream 1000 2500 4500] [--previous REV] [--only decode edit neighbour]

SmolLM2-135M-Instruct, ``leyline-server`` as its own process, over HTTP (``concurrency_runs``):

* **decode** — C = 1 / 2 / 4 / 8 concurrent greedy streams of ``--tokens`` tokens (short distinct
  prompts): aggregate decode tok/s while all C decode (the tokens that arrive between the last
  stream's first token and the first stream's last one, over that time; median of ``--rounds``),
  next to the limit measured in the same run: the engine core's own batched step of C sequences
  with the same prompts, no server (target ≥ 0.85× at C = 8).
  With ``--previous REV``, C = 1 is also measured on a server started from a git worktree of REV,
  in alternating rounds (ABBA), and the median per-round ratio is printed (target ≥ 0.95×).
* **edit** — through the SDK (``AsyncLeyline``, an explicit session, default renderer): a
  conversation with an old ~1.5k-token tool output and ``--downstream`` tokens after it; the agent
  stubs the old output (its own edit, spliced) and asks on. Time to the first token of that turn,
  broken down (the SDK's own work, the server's parts from ``leyline.timings``, the rest: HTTP and
  JSON), against the engine's own splice + prefill + first token (the same tokens and directives,
  through its scheduler in this process: target within 1.3×) and plain llama.cpp's re-prefill of the
  same edit (llama-cpp-python's ``Llama``: target ≥ 50× slower at ~4.5k).
* **neighbour** — key B's short chat alone, and while key A's ~4,000-token prompt prefills: B's time
  to first token against "2× alone + one chunk" (A's prefill time per chunk of
  ``--chunked-prefill-size``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import concurrency_runs as runs  # noqa: E402

CHUNK = 256  # the server's default --chunked-prefill-size


def decode_table(engines: list[str], concurrency: list[int], tokens: int, rounds: int, words: int) -> None:
    """Aggregate decode tok/s over HTTP next to the engine's own batched limit."""
    print("\n## Decode: aggregate tok/s over HTTP vs the engine's own batched step\n")
    print("| engine | C | over HTTP (tok/s) | limit: the engine's batched step (tok/s) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for engine in engines:
        http: dict[int, float] = {}
        with runs.server(engine) as url:
            asyncio.run(runs.warm_up(url))
            for c in concurrency:
                got = [asyncio.run(runs.decode_round(url, c, tokens, words, r)) for r in range(rounds)]
                http[c] = statistics.median(got)
        for c in concurrency:
            limit = statistics.median(runs.engine_limit(engine, c, tokens, words) for _ in range(max(1, rounds // 2)))
            print(f"| {engine} | {c} | {http[c]:.1f} | {limit:.1f} | {http[c] / limit:.2f}× |", flush=True)


def previous_table(engines: list[str], rev: str, tokens: int, rounds: int, words: int) -> None:
    """Single-stream decode tok/s, this tree against ``rev``, alternating rounds."""
    root = runs.ROOT
    print(f"\n## Single-stream decode: this tree vs {rev} (alternating rounds, ABBA)\n")
    print("| engine | this tree (median tok/s) | previous | median per-round ratio (min–max) |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "previous"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)  # fmt: skip
        try:
            for engine in engines:
                ours, theirs, ratios = [], [], []
                with runs.server(engine) as new, runs.server(engine, src=tree / "src") as old:
                    for url in (new, old):
                        asyncio.run(runs.warm_up(url))
                    for r in range(rounds):
                        order = (new, old) if r % 2 == 0 else (old, new)
                        got = {url: asyncio.run(runs.decode_round(url, 1, tokens, words, r)) for url in order}
                        ours.append(got[new])
                        theirs.append(got[old])
                        ratios.append(got[new] / got[old])
                spread = f"{statistics.median(ratios):.3f}× ({min(ratios):.3f}–{max(ratios):.3f})"
                print(f"| {engine} | {statistics.median(ours):.1f} | {statistics.median(theirs):.1f} | {spread} |")
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)


def _words_for(tokens: int) -> int:
    """Words of ``runs.document`` that make about ``tokens`` tokens of SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    assert path is not None
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    per_word = len(tok(runs.document(1, 1000))["input_ids"]) / 1000
    return max(1, round(tokens / per_word))


def edit_table(downstream: list[int]) -> None:
    """The turn after an edit through the SDK over HTTP, broken down, vs the engine and llama.cpp."""
    print("\n## The turn after an edit (llama.cpp engine; SDK over HTTP; the old output ~1.5k tokens)\n")
    print("| downstream tokens | first token, SDK over HTTP (s) | SDK's own (ms) | server: render / admit+reserve / "
          "queue / splice / prefill / first token (ms) | HTTP and the rest (ms) | engine's own splice + prefill + "
          "first token (s) | ratio | llama.cpp re-prefill (s) | × sooner |")  # fmt: skip
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    old_words = _words_for(1500)
    for target in downstream:
        with runs.server("llamacpp") as url:
            asyncio.run(runs.after_edit(url, 40, 40))  # warm-up
            got = asyncio.run(runs.after_edit(url, old_words, _words_for(target)))
        if got["fallback"] is not None or not got["rotated"]:
            print(f"| {target} | the splice did not happen: {got['fallback']} |")
            continue
        own = asyncio.run(runs.engine_after_edit("llamacpp", got["base"], got["prompt"], got["directives"]))
        plain = runs.llamacpp_reprefill(got["base"], got["prompt"])
        t = got["timings"]
        server = f"{t['render']:.0f} / {t['admit'] + t['reserve']:.0f} / {t['queue']:.0f} / {t['splice']:.0f} / " \
                 f"{t['prefill']:.0f} / {t['first_token']:.0f}"  # fmt: skip
        rest = got["seconds"] * 1e3 - got["prepare_ms"] - t["total"]
        ratios = f"{own:.3f} | {got['seconds'] / own:.2f}× | {plain:.2f} | {plain / got['seconds']:.1f}×"
        print(f"| {got['downstream']:,} | {got['seconds']:.3f} | {got['prepare_ms']:.0f} | {server} | {rest:.0f} | "
              f"{ratios} |", flush=True)  # fmt: skip


def neighbour_table(engines: list[str]) -> None:
    """Key B's first token beside key A's 4,000-token prefill."""
    print("\n## A neighbour's first token (key B's short chat while key A prefills ~4,000 tokens)\n")
    print("| engine | B alone (s) | B beside A (s) | A's prefill (tokens, s) | one chunk (s) | bound: 2× alone + "
          "one chunk (s) | within |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    words = _words_for(4000)
    for engine in engines:
        with runs.server(engine, flags=["--api-key", "ka", "--api-key", "kb"]) as url:
            got: dict[str, Any] = asyncio.run(runs.neighbour(url, words))
        chunk = got["long_prefill_s"] / math.ceil(got["long_tokens"] / CHUNK)
        bound = 2 * got["alone"] + chunk
        print(f"| {engine} | {got['alone']:.3f} | {got['beside']:.3f} | {got['long_tokens']:,}, "
              f"{got['long_prefill_s']:.1f} | {chunk:.3f} | {bound:.3f} | "
              f"{'yes' if got['beside'] <= bound else 'NO'} |", flush=True)  # fmt: skip


def main() -> None:
    """Run the tables asked for (all by default) and print them as markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["llamacpp", "embedded"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--words", type=int, default=30, help="words of each decode stream's prompt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--downstream", nargs="+", type=int, default=[1000, 2500, 4500])
    parser.add_argument("--previous", default=None, help="a git revision to compare single-stream decode with")
    parser.add_argument("--only", nargs="+", choices=["decode", "edit", "neighbour"], default=None)
    args = parser.parse_args()
    only = set(args.only or ["decode", "edit", "neighbour"])
    print(f"# bench_concurrency: SmolLM2-135M-Instruct, {' '.join(sys.argv[1:]) or 'defaults'}")
    if "decode" in only:
        decode_table(args.engines, args.concurrency, args.tokens, args.rounds, args.words)
        if args.previous:
            previous_table(args.engines, args.previous, args.tokens, max(args.rounds, 4), args.words)
    if "edit" in only:
        edit_table(args.downstream)
    if "neighbour" in only:
        neighbour_table(args.engines)


if __name__ == "__main__":
    main()
