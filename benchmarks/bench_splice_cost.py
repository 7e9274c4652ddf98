"""The splice's own cost against its limit, per engine, on SmolLM2-135M (CPU).

    .venv/bin/python benchmarks/bench_splice_cost.py [--engines embedded,llamacpp] [--runs 7]
        [--downstream 2890] [--stub 27] [--pools 256,1024] [--previous]

A session holds ``head | old tool output (~420 tokens) | downstream D`` (the scenario of
``bench_vs_llamacpp.py``); an ``amortize`` directive replaces the tool output by a ``--stub``-token
stub, so the splice rotates ``D + 2`` tokens and prefills the stub. ``splice_ms`` is the executor's
own report (plan, moves, fills, canary, commit; the turn's prefill is not in it).

A splice costs at least the **prefill of its replacement** plus a **copy of the moved rows**;
the limit is those two, measured in the same process, round by round with the splice:

* prefill — the stub computed after the kept prefix: on the embedded engine transformers' own
  forward over a ``DynamicCache`` holding the prefix; on llama.cpp ``llama_decode`` of the stub
  into a sequence holding only the prefix, in an otherwise empty pool;
* copy — the moved rows read and written once: a torch slice copy of K and V, layer by layer
  (embedded), a ``memcpy`` of the rows' bytes (llama.cpp). llama.cpp gives no access to its
  cells' memory: its only copy is the state API, out and back in (``SequenceCache.copy_cells``),
  timed as "the engine's own copy" in a last column.

llama.cpp runs with its float32 cache (the CLI's default) at each ``--pools`` size in MiB: the
splice must not grow with the pool. ``--previous`` also times the paths the engines used
before: llama.cpp's ``seq_add`` (which re-rotates every pool cell at the next decode) and the
embedded engine's plain torch rotation. Medians of ``--runs`` rounds (the machine is shared);
writes ``docs/results/tables/splice_cost.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_llamacpp import Scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _ms(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


class Case:
    """The session, the directive and the kept prefix, tokenized once."""

    def __init__(self, tokenize: Callable[[str], list[int]], downstream: int, stub: int) -> None:
        from leyline_sdk.core.directives import Directive

        scenario = Scenario(tokenize)
        self.base, _, directive = scenario.context(downstream)
        words = "[tool output elided: 30 lines of compute() values; the full log stays on disk, see the run] " * 4
        self.stub = tokenize(words)[:stub]
        self.keep = directive.start
        self.directive = Directive(start=directive.start, end=directive.end, replacement=self.stub)
        self.moved = len(self.base) - directive.end


def splice_once(core: Any, case: Case, n: int) -> Any:
    """Cache the session (untimed), splice it; the report."""
    from leyline_server.contract.values import CacheScope, SpliceRequest
    from leyline_server.splice import splice

    if hasattr(core, "drop_idle"):
        core.drop_idle()  # llama.cpp: only this session in the pool (nothing to park on the way)
    scope = CacheScope(salt=f"round{n}", private=f"session{n}")  # no round reuses another's KV
    handle = core.prefill(case.base, scope).handle
    handle, report = splice(core, handle, SpliceRequest([case.directive]))
    core.release(handle)
    if not report.applied or report.fallback is not None:
        raise RuntimeError(f"the splice fell back: {report}")
    return report


def embedded_limits(core: Any, case: Case) -> tuple[float, float, float]:
    """(ms to prefill the stub after the kept prefix with transformers, ms to copy the moved rows, the same)."""
    import torch
    from transformers import DynamicCache

    model, pool = core.model, core.pool
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([case.base[: case.keep]]), cache=cache, use_cache=True, logits_to_keep=1)
        positions = torch.arange(case.keep, case.keep + len(case.stub))[None]
        ids = torch.tensor([case.stub])
        prefill = _ms(lambda: model(input_ids=ids, position_ids=positions, cache=cache, logits_to_keep=1))
    n, src = case.moved, pool.capacity - case.moved  # a run of rows, into buffers of their size
    keys = torch.empty_like(pool.keys[:, :n])
    values = torch.empty_like(pool.values[:, :n]) if pool.values is not None else None

    def copy() -> None:
        for layer in range(pool.keys.shape[0]):
            keys[layer].copy_(pool.keys[layer, src : src + n])
            if values is not None and pool.values is not None:
                values[layer].copy_(pool.values[layer, src : src + n])

    copy()  # first touch of the destination pages is not part of a copy
    ms = _ms(copy)
    return prefill, ms, ms  # torch copies rows directly: the engine's own copy is the plain one


def llamacpp_limits(core: Any, case: Case) -> tuple[float, float, float]:
    """(ms to decode the stub after the kept prefix in an empty pool, ms to memcpy the moved rows'
    bytes, ms for llama.cpp's own copy of those cells: the state API out and back in)."""
    import numpy as np

    from leyline_server.engines.llamacpp.engine import COPY, SCRATCH

    core.drop_idle()
    ctx, cache = core.ctx, core.cache
    ctx.seq_rm(SCRATCH)
    cache.decode(SCRATCH, case.base, 0, want_logits=False)  # the session's cells, to copy from

    def state_copy() -> None:  # out of the pool and back in (a small pool has no room for both)
        ctx.seq_rm(COPY)
        ctx.seq_cp(SCRATCH, COPY, case.directive.end, len(case.base))
        data = ctx.state_get(COPY, cache.lift_buffer(ctx.state_size(COPY)))
        ctx.seq_rm(COPY)
        ctx.seq_rm(SCRATCH, case.directive.end, -1)
        if not ctx.state_set(data, COPY):
            raise RuntimeError("no room for the copy")
        ctx.seq_cp(COPY, SCRATCH)
        ctx.seq_rm(COPY)

    state_copy()  # warm the reused host buffer, as a running engine has it
    own = _ms(state_copy)
    ctx.seq_rm(SCRATCH, case.keep, -1)  # only the kept prefix stays
    prefill = _ms(lambda: cache.decode(SCRATCH, case.stub, case.keep, want_logits=False))
    ctx.seq_rm(SCRATCH)
    size = case.moved * core.model.cell_bytes(core.kv_type)
    a, b = np.ones(size, dtype=np.uint8), np.empty(size, dtype=np.uint8)
    np.copyto(b, a)  # first touch of the destination pages is not part of a copy
    return prefill, _ms(lambda: np.copyto(b, a)), own


def build(which: str, pool_mb: float) -> tuple[Any, Callable[[str], list[int]], str]:
    """(engine core, tokenizer function, pool description) for SmolLM2 on ``which``."""
    from leyline_server.engines.config import EngineConfig

    config = EngineConfig(engine=which, model="smollm2-135m", kv_budget_mb=pool_mb)
    if which == "embedded":
        import torch

        from leyline_server.engines.embedded.presets import load_engine

        torch.set_num_threads(os.cpu_count() or 2)
        core, tokenizer = load_engine(config)
        return core, lambda text: tokenizer.encode(text, add_special_tokens=False), f"{core.pool.capacity:,} slots"
    from leyline_server.engines.llamacpp.loader import load_llamacpp

    engine, _ = load_llamacpp(config)
    core = engine.core  # type: ignore[attr-defined]
    return core, core.model.tokenize, f"{core.ctx.n_ctx:,} cells"


def measure(which: str, pool_mb: float, args: argparse.Namespace) -> dict[str, Any]:
    """Medians of ``args.runs`` rounds of (splice, [previous path], prefill limit, copy limit)."""
    core, tokenize, pool = build(which, pool_mb)
    case = Case(tokenize, args.downstream, args.stub)
    limits = embedded_limits if which == "embedded" else llamacpp_limits
    samples: dict[str, list[float]] = {"splice": [], "previous": [], "prefill": [], "copy": [], "own": []}
    report = None
    for n in range(args.runs + 1):  # round 0 warms up
        report = splice_once(core, case, n)
        previous = _previous(core, case, n) if args.previous else None
        prefill, copy, own = limits(core, case)
        if n:
            samples["splice"].append(report.splice_ms)
            samples["prefill"].append(prefill)
            samples["copy"].append(copy)
            samples["own"].append(own)
            if previous is not None:
                samples["previous"].append(previous)
        print(f"  {which} {pool}: round {n}: splice {report.splice_ms:.0f} ms, previous path {previous or 0:.0f}, "
              f"prefill {prefill:.0f}, copy {copy:.1f} (engine's own {own:.1f})", flush=True)  # fmt: skip
    core.close()
    row = {k: statistics.median(v) for k, v in samples.items() if v}
    assert report is not None
    return {"engine": which, "pool": pool, "rotated": report.rotated_tokens, "prefilled": report.prefilled_tokens,
            **row}  # fmt: skip


def _previous(core: Any, case: Case, n: int) -> float:
    """splice_ms through the path the engine used before (llama.cpp: seq_add; embedded: torch rotation)."""
    if hasattr(core, "shifter"):
        saved, core.shifter = core.shifter, None
        try:
            return float(splice_once(core, case, 10_000 + n).splice_ms)
        finally:
            core.shifter = saved
    core.rotate_backend = "torch"
    try:
        return float(splice_once(core, case, 10_000 + n).splice_ms)
    finally:
        core.rotate_backend = "auto"


def table(rows: list[dict[str, Any]], previous: bool) -> str:
    """The markdown table: the limit is prefill + plain copy; the last column counts the engine's own copy."""
    head = "| engine | KV pool | rotated | prefilled | splice_ms |"
    head += " previous path |" if previous else ""
    head += " limit: prefill | limit: copy | limit | splice / limit |"
    head += " engine's own copy | splice / (prefill + own copy) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        limit = r["prefill"] + r["copy"]
        cells = [r["engine"], r["pool"], f"{r['rotated']:,}", str(r["prefilled"]), f"{r['splice']:.0f} ms"]
        if previous:
            cells.append(f"{r['previous']:.0f} ms ({r['previous'] / limit:.1f}x)")
        cells += [f"{r['prefill']:.0f} ms", f"{r['copy']:.1f} ms", f"{limit:.0f} ms", f"**{r['splice'] / limit:.2f}x**"]
        cells += [f"{r['own']:.1f} ms", f"{r['splice'] / (r['prefill'] + r['own']):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Measure each engine (and each llama.cpp pool), print and write the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engines", default="embedded,llamacpp")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--downstream", type=int, default=2890)
    parser.add_argument("--stub", type=int, default=27)
    parser.add_argument("--pools", default="256,1024", help="llama.cpp KV pools in MiB (float32 cache)")
    parser.add_argument("--embedded-pool", type=float, default=1024.0, help="the embedded engine's pool, MiB")
    parser.add_argument("--previous", action="store_true", help="also time the engines' previous paths")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "tables")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for which in args.engines.split(","):
        pools = [args.embedded_pool] if which == "embedded" else [float(p) for p in args.pools.split(",")]
        rows += [measure(which, pool, args) for pool in pools]
    command = " ".join(["python", "benchmarks/bench_splice_cost.py", *sys.argv[1:]])
    header = (
        f"`{command}`\n\nSmolLM2-135M-Instruct (embedded: fp32 weights and KV; llama.cpp: Q4_1 weights, float32 "
        f"KV), {os.cpu_count()} cores, medians of {args.runs} rounds; load average {os.getloadavg()[0]:.1f}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    text = header + "\n\n" + table(rows, args.previous)
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "splice_cost.md").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
