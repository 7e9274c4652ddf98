"""The ``leyline-server`` console script: starts, serves, shuts down gracefully on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.e2e.server_helpers import free_port


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 120) -> None:
    """Poll /health until the server answers (fail if the process died or time ran out)."""
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)


def test_cli_serves_and_stops_cleanly():
    port = free_port()
    env = {**os.environ, "LEYLINE_API_KEYS": "sk-env"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leyline_server.cli",
            "--model",
            "tiny-gqa",
            "--port",
            str(port),
            "--kv-budget-mb",
            "8",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(proc, port)
        headers = {"Authorization": "Bearer sk-env"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers=headers,
            timeout=60,
            json={"model": "tiny-gqa", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0


def test_cli_refuses_unavailable_engine_and_unknown_model():
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--engine", "sglang"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "SGLang engine is not part of this release" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--model", "/no/such/model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "neither a preset" in out.stderr


def test_sigterm_during_a_stream_ends_it_and_exits_cleanly():
    import threading

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leyline_server.cli",
            "--model",
            "tiny-mla",
            "--port",
            str(port),
            "--kv-budget-mb",
            "64",
            "--preset-layers",
            "4",
            "--graceful-timeout",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    received = []
    try:
        wait_healthy(proc, port)

        def stream():
            body = {
                "model": "tiny-mla",
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": 4000,
                "temperature": 1.0,
                "seed": 1,
                "stream": True,
            }
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120) as r:
                    for line in r.iter_lines():
                        received.append(line)
            except httpx.HTTPError as exc:  # the server may cut the stream at its deadline
                received.append(f"closed: {exc!r}")

        reader = threading.Thread(target=stream)
        reader.start()
        while len(received) < 5:
            time.sleep(0.05)
    finally:
        started = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    reader.join(timeout=60)
    assert code == 0 and not reader.is_alive()
    assert time.time() - started < 30  # the in-flight stream did not hold the shutdown
    assert len(received) >= 5
