"""Continue-after-edit on the embedded engine: splice vs forget vs no cache.

Scenario: a session holds ``prefix (256) | edited span (1,024) | downstream (D)``. The agent
replaces the span by a 16-token stub and sends a 32-token new turn. We time, from the edit to
the next-token logits of the new turn:

* splice — amortize directive (rotate D, prefill the stub) + prefill of the turn;
* forget — forget directive (re-prefill stub + D) + prefill of the turn;
* no cache — a cold prefill of the whole edited conversation + turn.

Model: ``tiny-mla`` (DeepSeek-V2 style) scaled to ~50M parameters, fp32, sdpa attention, CPU.

    python benchmarks/bench_engine.py [--downstream 512 2048 8192] [--layers 12]
"""

from __future__ import annotations

import argparse
import time

from leyline_sdk.core.directives import Directive, apply
from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.embedded.engine import EmbeddedEngine
from leyline_server.engines.embedded.pool import SlotPool, layout_from_config
from leyline_server.engines.embedded.presets import preset_config
from leyline_server.rope import rope_spec_from_config
from leyline_server.splice import splice
from leyline_server.tiny_models import build_model

SESSION = CacheScope(private="bench")

SCALE = dict(
    hidden_size=512,
    intermediate_size=2048,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=256,
    qk_rope_head_dim=64,
    qk_nope_head_dim=64,
    v_head_dim=64,
)


def make_engine(model, kv_budget_mb: float) -> EmbeddedEngine:
    """A fresh engine (an empty pool) over ``model``."""
    pool = SlotPool.from_budget(layout_from_config(model.config), kv_budget_mb)
    return EmbeddedEngine(model, pool, rope_spec_from_config(model.config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--downstream", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--span", type=int, default=1024)
    parser.add_argument("--stub", type=int, default=16)
    args = parser.parse_args()

    config = preset_config("tiny-mla", layers=args.layers, **SCALE)
    config._attn_implementation = "sdpa"
    model = build_model(config, seed=0)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny-mla scaled: {params / 1e6:.1f}M parameters, {args.layers} layers, fp32, CPU")
    print("\n| downstream | splice | forget | no cache | forget / splice | rotated | prefilled | splice alone |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in args.downstream:
        base = [(31 * i + 7) % 1000 + 7 for i in range(256 + args.span + d)]
        turn = [(13 * i + 5) % 1000 + 7 for i in range(32)]
        stub = list(range(100, 100 + args.stub))
        times = {}
        report = None
        for mode in ("amortize", "forget"):
            eng = make_engine(model, kv_budget_mb=4 * len(base) * 1 * (576 * 4) * args.layers / 2**20 + 64)
            pinned = eng.prefill(base, SESSION).handle
            directive = [Directive(start=256, end=256 + args.span, replacement=stub, mode=mode)]
            new = apply(base, directive)
            t0 = time.perf_counter()
            pinned, rep = splice(eng, pinned, SpliceRequest(directive))
            eng.prefill(new + turn, SESSION, previous=pinned)
            times[mode] = time.perf_counter() - t0
            report = rep if mode == "amortize" else report
            assert rep.applied, rep
        eng = make_engine(model, kv_budget_mb=2 * len(base) * (576 * 4) * args.layers / 2**20 + 64)
        t0 = time.perf_counter()
        eng.prefill(new + turn, SESSION)
        times["cold"] = time.perf_counter() - t0
        print(
            f"| {d:,} | {times['amortize']:.2f} s | {times['forget']:.2f} s | {times['cold']:.2f} s | "
            f"{times['forget'] / times['amortize']:.1f}x | {report.rotated_tokens:,} | {report.prefilled_tokens:,} | "
            f"{report.splice_ms:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
