"""Run a Leyline server in-process, on a loopback port, in a background thread.

For notebooks, examples, the demo and tests: the real uvicorn server and the real HTTP protocol,
without a second process::

    from leyline_server.local import local_service, serve_in_thread

    with serve_in_thread(local_service("tiny-mla")) as base_url:
        client = AsyncLeyline(base_url=base_url + "/v1")
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["free_port", "local_service", "serve_in_thread"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_service(
    model: str = "tiny-mla",
    layers: int = 2,
    kv_budget_mb: float = 8.0,
    engine: str = "embedded",
    prefix_cache: bool = True,
    swap_space_gb: float = 4.0,
    kv_cache_dtype: str = "auto",
    **config: Any,
) -> Any:
    """A :class:`~leyline_server.api.service.LeylineService` for ``model`` (presets need no download).

    ``config`` overrides :class:`~leyline_server.api.service.ServerConfig` fields; by default the
    context is 4,096 tokens (capped by the model and the pool, which tests keep small on purpose)
    and a request without ``max_tokens`` generates at most 16. ``swap_space_gb``: the llama.cpp
    engine's parking budget (``--swap-space``); ``kv_cache_dtype``: ``--kv-cache-dtype`` (``auto``:
    float16 on llama.cpp, as the CLI).
    """
    from leyline_server.api.service import LeylineService, ServerConfig
    from leyline_server.engines.factory import EngineConfig, build_engine

    settings: dict[str, Any] = {"model_name": model, "max_context_tokens": 4096, "default_max_tokens": 16, **config}
    engine_config = EngineConfig(
        engine=engine,
        model=model,
        kv_budget_mb=kv_budget_mb,
        preset_layers=layers,
        prefix_cache=prefix_cache,
        swap_space_gb=swap_space_gb,
        kv_cache_dtype=kv_cache_dtype,
    )
    built, tokenizer = build_engine(engine_config)
    return LeylineService(built, tokenizer, ServerConfig(**settings))


@contextlib.contextmanager
def serve_in_thread(
    service_or_app: Any, port: int | None = None, host: str = "127.0.0.1", sock: socket.socket | None = None
) -> Iterator[str]:
    """Serve a ``LeylineService`` (or an ASGI app) until the block ends; yields the base URL.

    ``sock``: an already bound socket to serve on instead of ``host:port`` (closed at the end).
    """
    import uvicorn

    from leyline_server.api.app import create_app
    from leyline_server.api.service import LeylineService

    if sock is not None:
        host, port = sock.getsockname()[:2]
    port = port or free_port()
    app = create_app(service_or_app) if isinstance(service_or_app, LeylineService) else service_or_app
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    sockets = {"sockets": [sock]} if sock is not None else {}
    thread = threading.Thread(target=server.run, kwargs=sockets, daemon=True, name="leyline-server")
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        if sock is not None:
            sock.close()
