"""Every example runs (as a user would run it) and shows what it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_walkthrough_runs_and_verifies():
    out = run("walkthrough.py")
    assert out.returncode == 0, out.stderr
    assert "verified: apply(old, directives) == new" in out.stdout
    assert "stub (amortize)            applied=True" in out.stdout
    assert "mode=forget" in out.stdout and "mode=amortize" in out.stdout


def test_demo_compares_leyline_with_plain_re_prefill():
    from leyline_server.models import find_smollm2_gguf

    model = ["--model", "smollm2-135m"] if find_smollm2_gguf() is not None else ["--model", "tiny-mla"]
    out = run("demo.py", *model, "--engine", "embedded", timeout=600)
    assert out.returncode == 0, out.stderr
    assert "[##############################] 6/6" in out.stderr  # progress shown
    assert "on the embedded engine" in out.stdout  # says which engine it used
    rows = [line for line in out.stdout.splitlines() if re.match(r"^\s+\d+ \|", line)]
    assert len(rows) == 6
    assert "Leyline answers:" in out.stdout and "plain answers:" in out.stdout  # the model's answers shown
    m = re.search(r"prefilled tokens: Leyline ([\d,]+) vs plain ([\d,]+)", out.stdout)
    assert m and int(m[1].replace(",", "")) < int(m[2].replace(",", ""))
    assert "rotated instead of recomputed" in out.stdout


def test_agent_loop_prints_a_turn_table():
    out = run("agent_loop.py", "--turns", "6")
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+", line)]
    assert len(lines) == 6 and int(lines[-1][3]) > 0  # rotated tokens once evictions start
    assert "history kept in full: 12 messages" in out.stdout


def test_openai_drop_in():
    out = run("openai_drop_in.py")
    assert out.returncode == 0, out.stderr
    assert "turn 4:" in out.stdout and "rotated=0" in out.stdout and "turn 5 (streamed)" in out.stdout
    assert re.search(r"turn 4: .* rotated=[1-9]", out.stdout)


def test_custom_policy_registers_and_runs():
    out = run("custom_policy.py")
    assert out.returncode == 0, out.stderr
    assert re.search(r"turn 6: cleared [1-9]", out.stdout)


def test_debug_gym_agent_says_what_it_needs():
    out = run("debug_gym_agent.py")
    assert out.returncode == 2
    assert "debug-gym is not installed" in out.stderr or "a real model is needed" in out.stderr


def test_a_wrong_base_url_is_one_line_not_a_traceback():
    from tests.e2e.server_helpers import free_port, make_service, running_server

    out = run("agent_loop.py", "--turns", "1", "--base-url", f"http://127.0.0.1:{free_port()}/v1", timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert (
        out.stderr.startswith("leyline: cannot reach http://127.0.0.1:") and len(out.stderr.strip().splitlines()) == 1
    )
    with running_server(make_service()) as url:
        out = run("openai_drop_in.py", "--base-url", url, timeout=120)  # forgot the /v1
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "does the URL end in /v1?" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cluster_demo_moves_a_stopped_replicas_sessions():
    out = run("cluster.py", "--agents", "6", "--turns", "6", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(stopped)") == 1 and "6 agents finished 36 turns, no error" in out.stdout
    moved = re.search(r"(\d+) sessions moved \(base_mismatch\)", out.stdout)
    assert moved and int(moved[1]) >= 1
    assert "then spliced again: True" in out.stdout
