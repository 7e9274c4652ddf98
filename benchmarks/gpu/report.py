"""One markdown table from the GPU run: bench_rotate.py's output and sglang_e2e.py's JSON.

    python benchmarks/gpu/report.py --rotate rotate.txt --e2e sglang.json [--note "..."] > report.md

A missing or failed part shows as ``not run`` with the reason given by ``--note part=reason``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TARGET_COPY_FRACTION = 0.70  # the Triton kernel should reach 70 % of a plain copy's bandwidth


def parse_rotate(text: str) -> dict[tuple[str, int], dict[str, float]]:
    """``{(pool, tokens): {impl: ms}}`` from bench_rotate.py's table lines."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) < 7 or not parts[1].isdigit():
            continue
        try:
            out.setdefault((parts[0], int(parts[1])), {})[parts[2]] = float(parts[3])
        except ValueError:
            continue
    return out


def rotate_rows(timings: dict[tuple[str, int], dict[str, float]]) -> list[list[str]]:
    """Per pool and size: the Triton kernel's share of the copy's bandwidth against the 70 % target."""
    rows = []
    for (pool, tokens), impl in sorted(timings.items()):
        if "copy" not in impl or "triton" not in impl:
            continue
        share = impl["copy"] / impl["triton"]
        verdict = "ok" if share >= TARGET_COPY_FRACTION else "BELOW TARGET"
        rows.append([f"rotate_copy Triton vs copy, {pool}, {tokens // 1024}k tokens",
                     f"{share:.0%} of copy bandwidth ({impl['triton']:.2f} ms vs {impl['copy']:.2f} ms)",
                     f">= {TARGET_COPY_FRACTION:.0%}: {verdict}"])  # fmt: skip
    return rows


def _cell(run: dict[str, Any], key: str, fmt: str = "{}") -> str:
    return fmt.format(run[key]) if key in run else "?"


def e2e_rows(data: dict[str, Any]) -> list[list[str]]:
    """Startup, splice reports, cached tokens and continue-after-edit latency per downstream size."""
    rows = [["SGLang start (dummy weights, " + data.get("backend", "?") + " attention)",
             f"{data.get('startup_s', 0):.0f} s", ""]]  # fmt: skip
    for size, modes in sorted(data.get("runs", {}).items(), key=lambda kv: int(kv[0])):
        k = f"{int(size) // 1024}k downstream"
        a, f = modes.get("amortize", {}), modes.get("forget", {})
        ok = "ok" if a.get("conversation_reused") == a.get("conversation_expected") else "MISMATCH"
        rows.append([f"{k}: conversation, 2nd turn's cached tokens", f"{_cell(a, 'conversation_reused')} ({ok})",
                     f"{_cell(a, 'conversation_expected')} (the whole 1st turn)"])  # fmt: skip
        status = "applied" if a.get("applied") else f"fallback {a.get('fallback')}"
        rows.append([f"{k}: amortize splice", f"{status}, canary {a.get('canary')}, "
                     f"{_cell(a, 'rotated')} rotated, {_cell(a, 'prefilled')} prefilled, "
                     f"{_cell(a, 'splice_ms', '{:.1f}')} ms", "applied, canary passed"])  # fmt: skip
        ok = "ok" if a.get("next_cached") == a.get("expected_cached") else "MISMATCH"
        rows.append([f"{k}: next request's cached_tokens", f"{_cell(a, 'next_cached')} ({ok})",
                     f"{_cell(a, 'expected_cached')} (the whole edited sequence)"])  # fmt: skip
        if "ttft_ms" in a and "ttft_ms" in f:
            speedup = f["ttft_ms"] / max(a["ttft_ms"], 1e-9)
            rows.append([f"{k}: continue-after-edit, splice vs forget", f"{a['ttft_ms']:.0f} ms vs "
                         f"{f['ttft_ms']:.0f} ms ({speedup:.1f}x)", "splice faster"])  # fmt: skip
    return rows


def table(rows: list[list[str]]) -> str:
    """A markdown table of (check, result, target) rows."""
    lines = ["| check | result | target |", "| --- | --- | --- |"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    """Read what exists, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rotate", type=Path)
    parser.add_argument("--e2e", type=Path)
    parser.add_argument("--note", action="append", default=[], help="part=reason for a part that did not run")
    args = parser.parse_args()
    notes = dict(n.split("=", 1) for n in args.note if "=" in n)
    rows: list[list[str]] = []
    if args.rotate and args.rotate.is_file() and (found := rotate_rows(parse_rotate(args.rotate.read_text()))):
        rows += found
    else:
        rows.append(["rotate_copy Triton vs copy", "not run", notes.get("rotate", "no output")])
    if args.e2e and args.e2e.is_file():
        rows += e2e_rows(json.loads(args.e2e.read_text()))
    else:
        rows.append(["SGLang end to end", "not run", notes.get("e2e", "no output")])
    print(table(rows))


if __name__ == "__main__":
    main()
