"""``leyline-server``: serve a model with the Leyline extension on an OpenAI-compatible API.

    leyline-server --model tiny-mla --port 8000
    leyline-server --model /path/to/checkpoint --kv-budget-mb 4096 --api-key sk-local --auto-splice

API keys may also come from ``LEYLINE_API_KEYS`` (comma-separated). On SIGINT/SIGTERM the server
stops accepting connections, lets in-flight requests finish (up to ``--graceful-timeout``
seconds; streams still open then are cancelled and keep what they generated), releases every
session and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

__all__ = ["main", "build_service", "parse_args"]

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="leyline-server", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-mla", help="tiny-mla | tiny-mla-v3 | tiny-gqa | PATH to a checkpoint")
    parser.add_argument("--engine", choices=("embedded", "sglang"), default="embedded")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--kv-budget-mb", type=float, default=256.0, help="memory for the KV slot pool")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--preset-layers", type=int, default=2, help="decoder layers of a preset model")
    parser.add_argument("--api-key", action="append", default=[], help="accepted API key (repeatable)")
    parser.add_argument("--auto-splice", action="store_true", help="splice edits of clients that send no directives")
    parser.add_argument("--max-context-tokens", type=int, default=None)
    parser.add_argument("--graceful-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return parser.parse_args(argv)


def build_service(args: argparse.Namespace) -> Any:
    """Load the model into an embedded engine and wrap it in a service."""
    import torch

    from leyline_server.api.service import LeylineService, ServerConfig
    from leyline_server.engines.embedded.presets import load_engine

    engine, tokenizer = load_engine(
        args.model, kv_budget_mb=args.kv_budget_mb, dtype=getattr(torch, args.dtype), layers=args.preset_layers
    )
    keys = set(args.api_key) | {k.strip() for k in os.environ.get("LEYLINE_API_KEYS", "").split(",") if k.strip()}
    max_positions = int(getattr(engine.model.config, "max_position_embeddings", 32_768))
    config = ServerConfig(
        model_name=args.model,
        api_keys=frozenset(keys),
        auto_splice=args.auto_splice,
        max_context_tokens=min(args.max_context_tokens or max_positions, max_positions, engine.pool.capacity),
    )
    return LeylineService(engine, tokenizer, config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.engine == "sglang":
        print(
            "leyline-server: the SGLang engine is not part of this release yet; use --engine embedded", file=sys.stderr
        )
        return 2
    try:
        service = build_service(args)
    except ValueError as exc:
        print(f"leyline-server: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from leyline_server.api.app import create_app

    logging.getLogger("leyline").info(
        "serving %s on http://%s:%d (KV pool: %d tokens, auth %s, auto-splice %s)",
        args.model,
        args.host,
        args.port,
        service.engine.pool.capacity,
        "on" if service.config.api_keys else "off",
        "on" if args.auto_splice else "off",
    )
    # uvicorn re-raises the signal it shut down on once it has restored the previous handlers;
    # with these no-op handlers in place a graceful shutdown ends in exit status 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(
        create_app(service),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
