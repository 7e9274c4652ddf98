"""Radix eviction cost: evict 10k tokens from a tree of 100k nodes (the heap of leaves, not a rescan).

    .venv/bin/python benchmarks/bench_radix.py [--nodes 100000] [--evict 10000]

Builds a tree of ``nodes`` single-token leaves under 1k shared prefixes, touches a random half
(so the LRU order is not insertion order), then times ``evict`` and checks the order against a
naive oracle. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from leyline_server.engines.embedded.radix import RadixCache


def build(nodes: int, seed: int = 0) -> tuple[RadixCache, dict[int, int]]:
    """A tree with ``nodes`` leaves (two tokens each, 1,000 shared first tokens) and each leaf's last use."""
    rng = random.Random(seed)
    tree = RadixCache()
    last: dict[int, int] = {}
    for i in range(nodes):  # prefix token p owns slot 2p; leaf i owns slot 2i + 1
        tree.insert([i % 1000, 10_000 + i], torch.tensor([i % 1000 * 2, 2 * i + 1]))
        last[i] = i
    for step, i in enumerate(rng.sample(range(nodes), nodes // 2)):
        tree.match_prefix([i % 1000, 10_000 + i])
        last[i] = nodes + step
    return tree, last


def main() -> None:
    """Time one eviction of ``--evict`` tokens and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--evict", type=int, default=10_000)
    args = parser.parse_args()
    t0 = time.perf_counter()
    tree, last = build(args.nodes)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    freed = tree.evict(args.evict)
    took = time.perf_counter() - t0
    oldest = sorted(last, key=last.__getitem__)[: args.evict]
    expected = {2 * i + 1 for i in oldest}
    assert set(freed.tolist()) == expected, "eviction order is not least-recently-used"
    print("| tree nodes | tokens evicted | build s | evict ms | LRU order |")
    print("| ---: | ---: | ---: | ---: | --- |")
    print(f"| {args.nodes:,} | {freed.numel():,} | {built:.1f} | {took * 1e3:.0f} | checked |")


if __name__ == "__main__":
    main()
