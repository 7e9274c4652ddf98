"""The two servers ``bench_vs_llama_server.py`` races, as processes, and the requests it times.

* :func:`leyline` — ``leyline-server`` on the llama.cpp engine, as a user starts it;
* :func:`llama_server` — llama.cpp's own server (``make peer``), as a user starts it: its
  defaults, the model's own chat template (``--jinja``), ``--cache-reuse N``.

Both answer ``/v1/chat/completions``; every measurement below goes through that one door, so the
two render, tokenize and sample the same requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".venv" / "share" / "leyline" / "peer" / "llama-server"


def free_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_process(
    cmd: Sequence[str], port: int, log: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run the server ``cmd`` (its output to ``log``, else inherited) until ``/health`` on ``port``
    answers 200; yield its base URL; stop it on exit."""
    if log is None:
        proc = subprocess.Popen(list(cmd), env=env, cwd=ROOT)
    else:
        with log.open("ab") as out:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}: see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.time() > deadline:
                raise RuntimeError(f"{cmd[0]} did not answer /health in 600 s: see {log}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def leyline(model: str, context: int, streams: int, log: Path, flags: Sequence[str] = ()) -> Iterator[str]:
    """``leyline-server`` serving ``model`` on the llama.cpp engine, room for ``streams`` full contexts."""
    port = free_port()
    kv_mb = max(256, context * streams * _kv_bytes_per_token(model) // 2**20 + 64)
    cmd = [sys.executable, "-m", "leyline_server.cli", "--model-path", model, "--engine", "llamacpp",
           "--port", str(port), "--context-length", str(context), "--kv-budget-mb", str(kv_mb),
           "--log-level", "warning", *flags]  # fmt: skip
    with serve_process(cmd, port, log) as url:
        yield url


@contextlib.contextmanager
def llama_server(
    gguf: Path, context: int, slots: int, cache_reuse: int, log: Path, flags: Sequence[str] = ()
) -> Iterator[str]:
    """llama.cpp's server on ``gguf``: ``slots`` parallel slots of ``context`` tokens each."""
    if not PEER.is_file():
        raise SystemExit(f"{PEER} is missing: run `make peer` (builds llama-server, ~8 minutes)")
    port = free_port()
    cmd = [str(PEER), "-m", str(gguf), "--port", str(port), "-c", str(context * slots), "-np", str(slots),
           "--cache-reuse", str(cache_reuse), "--jinja", "--no-webui", *flags]  # fmt: skip
    with serve_process(cmd, port, log) as url:
        yield url


def _kv_bytes_per_token(model: str) -> int:
    """float16 K and V of every layer (SmolLM2-135M: 30 layers x 3 KV heads x 64; Qwen2.5-Coder: 2 KV heads x 64)."""
    layers, width = {"smollm2-135m": (30, 192), "qwen2.5-coder-0.5b": (24, 128), "qwen2.5-coder-1.5b": (28, 256)}.get(
        model, (32, 1024)
    )
    return 2 * 2 * layers * width


def gguf_of(model: str) -> Path:
    """The GGUF file behind a Leyline model name (the same file both servers load)."""
    from leyline_server.models import find_smollm2_gguf, resolve_real_model

    path = find_smollm2_gguf() if model == "smollm2-135m" else resolve_real_model(model)
    if path is None:
        raise SystemExit(f"no GGUF for {model}")
    return path


MODEL = {"name": "smollm2-135m"}  # the model name requests carry (set by the benchmark)


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, extra: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One greedy streamed chat: seconds to the first token and to each token, the text, the usage."""
    model = MODEL["name"]
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}  # fmt: skip
    start, times, text, usage = time.perf_counter(), [], [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=3600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter() - start)
                    text.append(piece)
    total = time.perf_counter() - start
    return {"ttft": times[0] if times else total, "times": times, "text": "".join(text), "usage": usage,
            "total": total}  # fmt: skip


def decode_rate(result: dict[str, Any]) -> float:
    """Tokens per second after the first: completion tokens over the time from first to last token."""
    tokens = int(result["usage"].get("completion_tokens") or len(result["times"]))
    span = result["times"][-1] - result["times"][0] if len(result["times"]) > 1 else 0.0
    return (tokens - 1) / span if span > 0 else 0.0


def threads_note() -> str:
    """The machine's cores, for the table's caption."""
    return f"{os.cpu_count()} cores"
