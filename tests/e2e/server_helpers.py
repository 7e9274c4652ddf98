"""Start the real server (uvicorn, loopback, free port) in a background thread for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from leyline_server.api.app import create_app
from leyline_server.api.service import LeylineService, ServerConfig
from leyline_server.engines.embedded.presets import load_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_service(model: str = "tiny-mla", layers: int = 2, kv_budget_mb: float = 8.0, **config: Any) -> LeylineService:
    engine, tokenizer = load_engine(model, kv_budget_mb=kv_budget_mb, layers=layers)
    settings = {"model_name": model, "max_context_tokens": 4096, "default_max_tokens": 16, **config}
    return LeylineService(engine, tokenizer, ServerConfig(**settings))


@contextlib.contextmanager
def running_server(service: LeylineService | Any, port: int | None = None) -> Iterator[str]:
    """Serve ``service`` (or any ASGI app) on 127.0.0.1; yield the base URL; stop afterwards."""
    port = port or free_port()
    app = create_app(service) if isinstance(service, LeylineService) else service
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
