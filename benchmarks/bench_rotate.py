"""Throughput of rotate_copy against a plain copy of the same bytes (the memory-bound ceiling).

Pools: DeepSeek-V2-Lite-shaped MLA (27 layers, rows of 512 latent + 64 k_pe, bf16) and
Llama-3-8B-shaped GQA (32 layers, 8 kv heads x 128, K rotated + V copied, bf16), at 1k, 8k and
32k downstream tokens moved to fresh slots. On CUDA it times Triton, torch and the copy; on CPU
torch and the copy (the Triton interpreter is a correctness tool, not a speed one).

    python benchmarks/bench_rotate.py [--tokens 1024 8192 32768] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from leyline_server.kernels import rotate_copy
from leyline_server.rope import PairLayout, RopeSpec

SHAPES = {
    # name: (layers, heads, row, rotary offset, rotary dim, layout, has values)
    "mla-v2-lite": (27, 1, 576, 512, 64, PairLayout.INTERLEAVED, False),
    "gqa-llama3-8b": (32, 8, 128, 0, 128, PairLayout.HALF_SPLIT, True),
}


def spec_for(offset: int, width: int, layout: PairLayout) -> RopeSpec:
    return RopeSpec.plain(offset, width, layout)


def timed(fn, device: torch.device, repeat: int) -> float:
    fn()  # warm-up (and Triton compile)
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = ["triton", "torch"] if device.type == "cuda" else ["torch"]
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}")
    print("\n| pool | tokens | impl | ms | ktok/s | GB/s | vs copy |\n| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name in args.shapes:
        for n in args.tokens:
            bench_one(name, n, device, backends, args.repeat)


def row(name: str, n: int, impl: str, t: float, nbytes: int, t_copy: float) -> str:
    """One table line."""
    return f"| {name} | {n} | {impl} | {t * 1e3:.2f} | {n / t / 1e3:.0f} | {nbytes / t / 1e9:.1f} | {t / t_copy:.2f}x |"


def bench_one(name: str, n: int, device: torch.device, backends: list[str], repeat: int) -> None:
    """Time the copy and each backend for one pool shape and token count."""
    layers, heads, width_row, off, width, layout, has_values = SHAPES[name]
    spec = spec_for(off, width, layout)
    slots = 2 * n + 1
    keys = torch.randn(layers, slots, heads, width_row, device=device).to(torch.bfloat16)
    values = None
    if has_values:
        values = torch.randn(layers, slots, heads, width_row, device=device).to(torch.bfloat16)
    src = torch.arange(1, n + 1, device=device)
    dst = torch.arange(n + 1, 2 * n + 1, device=device)
    old = torch.arange(5000, 5000 + n, device=device)
    new = old - 1000
    moved = keys[:, :n].numel() * keys.element_size() * (2 if has_values else 1)
    nbytes = 2 * moved  # read + write

    def copy() -> None:
        # the fastest plain copy we found of the same rows: per layer gather + scatter
        for layer in range(layers):
            keys[layer].index_copy_(0, dst, keys[layer].index_select(0, src))
            if values is not None:
                values[layer].index_copy_(0, dst, values[layer].index_select(0, src))

    t_copy = timed(copy, device, repeat)
    print(row(name, n, "copy", t_copy, nbytes, t_copy))
    for backend in backends:
        t = timed(
            lambda b=backend: rotate_copy(keys, src, dst, old, new, spec, values=values, backend=b),
            device,
            repeat,
        )
        print(row(name, n, backend, t, nbytes, t_copy))


if __name__ == "__main__":
    main()
