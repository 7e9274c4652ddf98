"""Real Leyline servers for every engine, launched once per test session and shared.

* ``embedded`` and ``llamacpp`` — in this process: :func:`~leyline_server.local.local_service` on a
  loopback port (main venv, ``make test``);
* ``sglang`` — ``leyline-server --engine sglang`` as a subprocess on the CPU, with the test
  stand-ins (``tests/sglang/cpu_server.py``; SGLang venv, ``make test-sglang``). At most
  ``MAX_SGLANG`` of them run at once (each holds ~2 GB in three processes): the least recently
  used is stopped first.

Models (the same weights on every engine that serves them):

* ``gqa-1`` — the ``tiny-gqa`` preset with ONE layer (Llama, GQA; every engine);
* ``mla-1`` — the ``tiny-mla-v3`` preset with ONE layer (DeepSeek MLA with YaRN; embedded and
  SGLang: llama.cpp serves llama-style models only);
* ``smollm2`` — SmolLM2-135M-Instruct, 30 layers (every engine): where a splice must *not* equal
  a fresh prefill (deeper layers keep the notes), which is how "reused, not recomputed" shows.

Every server accepts the API keys ``KEYS`` (so the per-key cache isolation is on); the last one is
kept for the oracle's fresh prefills.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEYS = ("sk-conformance-a", "sk-conformance-b", "sk-conformance-oracle")  # the last one: fresh prefills
MAX_SGLANG = 3
# model -> (preset or real model name, decoder layers)
MODELS: dict[str, tuple[str, int]] = {
    "gqa-1": ("tiny-gqa", 1),
    "mla-1": ("tiny-mla-v3", 1),
    "smollm2": ("smollm2-135m", 0),
}
SERVES = {"embedded": set(MODELS), "llamacpp": {"gqa-1", "smollm2"}, "sglang": set(MODELS)}
# KV pool of each SGLang server, in tokens (mla-1's is small enough to provoke the capacity fallback)
SGLANG_POOL = {"gqa-1": 16384, "mla-1": 3072, "smollm2": 16384}

__all__ = ["EXACT", "KEYS", "MODELS", "SGLANG_POOL", "ServerPool", "Target", "available_engines", "exact_tolerance"]


def available_engines() -> list[str]:
    """The engines this venv runs: SGLang's venv runs ``sglang`` only (its transformers is too old
    for the embedded engine), the main venv ``embedded`` and, with its extra, ``llamacpp``.
    ``LEYLINE_CONFORMANCE_ENGINES`` (comma-separated) overrides."""
    chosen = os.environ.get("LEYLINE_CONFORMANCE_ENGINES")
    if chosen:
        return [e.strip() for e in chosen.split(",") if e.strip()]
    if importlib.util.find_spec("sglang") is not None:
        return ["sglang"]
    return ["embedded"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") is not None else [])


@dataclass
class Target:
    """A running server: its engine, model key, base URL, the model name to ask for, and the engine."""

    engine: str
    model: str
    url: str
    name: str
    launch_s: float
    service: Any = None  # the in-process LeylineService (embedded, llama.cpp), else None
    stop: Any = field(default=None, repr=False)


# How close "exactly a fresh prefill's answer" can be (top-5 logprobs): float32 everywhere (~1e-5
# seen), except llama.cpp's SmolLM2, a Q4_1 GGUF: its single-token and batched kernels round
# differently, so a plain cache hit there already answers ~0.08 nats away from a one-pass prefill.
EXACT = 1e-3
EXACT_QUANTIZED = 0.15


def exact_tolerance(target: Target) -> float:
    """The logprob tolerance of "exactly like a fresh prefill" on ``target``."""
    return EXACT_QUANTIZED if (target.engine, target.model) == ("llamacpp", "smollm2") else EXACT


class ServerPool:
    """Servers by ``(engine, model)``, started on first use, stopped by :meth:`close`."""

    def __init__(self, workdir: Path | None = None) -> None:
        self._dir = workdir or Path(tempfile.mkdtemp(prefix="leyline-servers-"))
        self._running: OrderedDict[tuple[str, str], Target] = OrderedDict()

    def get(self, engine: str, model: str) -> Target:
        """The server of ``model`` on ``engine`` (started now if it is not running)."""
        key = (engine, model)
        if key in self._running:
            self._running.move_to_end(key)
            return self._running[key]
        if model not in SERVES.get(engine, ()):
            raise ValueError(f"the {engine} engine does not serve {model}")
        if engine == "sglang":
            while sum(1 for e, _ in self._running if e == "sglang") >= MAX_SGLANG:
                oldest = next(k for k in self._running if k[0] == "sglang")
                self._running.pop(oldest).stop()
            target = self._sglang(model)
        else:
            target = self._local(engine, model)
        self._running[key] = target
        return target

    def _local(self, engine: str, model: str) -> Target:
        from leyline_server.local import local_service, serve_in_thread

        name, layers = MODELS[model]
        started = time.monotonic()
        # SmolLM2 takes ~46 KB a token: 256 MiB hold ~5.8k tokens, a session, a block and a request
        # at once; one key may reserve the whole pool (the tests use two keys, one at a time). KV in
        # float32 on every engine: the exact oracle (a one-layer splice equals a fresh prefill)
        service = local_service(
            name, layers=max(layers, 1), engine=engine, kv_budget_mb=256.0, kv_cache_dtype="float32",
            api_keys=frozenset(KEYS), max_context_tokens=4096, default_max_tokens=16, kv_share_per_key=1.0,
            admission_timeout_s=5.0,
        )  # fmt: skip
        stack = contextlib.ExitStack()
        url = stack.enter_context(serve_in_thread(service))

        def stop() -> None:
            stack.close()
            asyncio.run(service.shutdown())

        return Target(engine, model, url, name, time.monotonic() - started, service, stop)

    def _sglang(self, model: str) -> Target:
        from leyline_server.local import free_port
        from tests.sglang.cpu_server import SGLangServer, checkpoint

        name, layers = MODELS[model]
        path = checkpoint(name, layers)
        extra = ["--served-model-name", name, "--max-total-tokens", str(SGLANG_POOL[model])]
        extra += ["--kv-share-per-key", "1.0", "--admission-timeout", "5"]  # one key may use the whole pool
        for key in KEYS:
            extra += ["--api-key", key]
        server = SGLangServer(path, free_port(), self._dir / f"sglang-{model}.log", extra=extra)
        return Target("sglang", model, server.url, name, server.launch_s, None, server.stop)

    def launch_times(self) -> dict[str, float]:
        """Seconds each running server took to start."""
        return {f"{t.engine}/{t.model}": t.launch_s for t in self._running.values()}

    def close(self) -> None:
        """Stop every server."""
        while self._running:
            _, target = self._running.popitem()
            target.stop()
