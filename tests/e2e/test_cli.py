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
            "--model-path",
            "tiny-gqa",
            "--served-model-name",
            "m",
            "--context-length",
            "512",
            "--port",
            str(port),
            "--kv-budget-mb",
            "8",
            "--log-level",
            "info",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(proc, port)
        headers = {"Authorization": "Bearer sk-env"}
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/models").status_code == 401
        models = httpx.get(f"{url}/v1/models", headers=headers).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("m", 512)]
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=60, json=chat)
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=60, json={**chat, "model": "gpt-4o"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        # no max_tokens, a prompt near the limit: clamped to the room left, not refused
        near = {"model": "m", "messages": [{"role": "user", "content": "word " * 160}], "temperature": 0}
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=120, json=near)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["total_tokens"] <= 512
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        log = proc.stdout.read() if proc.stdout else ""
    assert code == 0
    assert "context 512 tokens" in log  # the startup log states the context limit


def test_cli_help_shows_familiar_flags_and_defaults():
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--model-path", "tiny-mla", "--served-model-name", "m",
         "--context-length", "4096", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0
    for flag in ("--model-path", "--served-model-name", "--context-length", "--mem-fraction-static", "--engine",
                 "--max-sessions-per-key", "--session-ttl", "--isolate-keys", "--max-body-mb", "--max-messages",
                 "--render-timeout", "--max-concurrent-per-key", "--kv-share-per-key", "--admission-timeout",
                 "--stream-stall-timeout"):  # fmt: skip
        assert flag in out.stdout
    assert "(default: 3600.0)" in out.stdout and "(default: auto)" in out.stdout  # --kv-cache-dtype
    text = " ".join(out.stdout.split())  # (the help is wrapped)
    assert "sized from the memory available" in text and "logged at start) --" in text  # no "(default: None)"


def test_cli_refuses_unavailable_engine_and_unknown_model():
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--engine", "sglang"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "pip install 'leyline[sglang]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1  # one line, no traceback
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--model", "/no/such/model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "neither a preset" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "leyline_server.cli", "--kv-share-per-key", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "kv_share_per_key must lie in (0, 1]" in out.stderr


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
