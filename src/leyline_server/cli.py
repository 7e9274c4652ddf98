"""``leyline-server``: serve a model with the Leyline extension on an OpenAI-compatible API.

    leyline-server --model-path tiny-mla --port 8000
    leyline-server --model-path /path/to/checkpoint --served-model-name my-model \\
        --context-length 8192 --kv-budget-mb 4096 --api-key sk-local --auto-splice

Flags follow SGLang's and vLLM's names where they mean the same thing (``--model-path``,
``--served-model-name``, ``--context-length``, ``--mem-fraction-static``). API keys may also
come from ``LEYLINE_API_KEYS`` (comma-separated). On SIGINT/SIGTERM the server stops accepting
connections, lets in-flight requests finish (up to ``--graceful-timeout`` seconds; streams still
open then are cancelled and keep what they generated), releases every session and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from leyline_server.cli_flags import build_parser, sampling_defaults
from leyline_server.engines.config import EngineConfig

__all__ = [
    "main", "build_parser", "build_service", "engine_config", "server_config", "parse_args", "kv_budget_mb",
    "sampling_defaults", "volatile_lines",
]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` shows every default)."""
    return _parse_engine_args(build_parser(), sys.argv[1:] if argv is None else list(argv))


def _parse_engine_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Leyline's flags; with ``--engine sglang`` every other flag passes through to SGLang.

    ``args.engine_args`` is SGLang's command line (empty for the other engines, which refuse
    unknown flags as before). Without the sglang extra this prints the install line and exits 2.
    """
    sglang_kv: list[str] = []
    if _names_sglang(argv):  # SGLang's own --kv-cache-dtype (its fp8 kinds too): passed through as given
        argv, sglang_kv = _split_flag(argv, "--kv-cache-dtype")
    known, extra = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    if known.engine != "sglang":
        args = parser.parse_args(argv)
        args.engine_args = []
        return args
    from leyline_server.engines.factory import require_extra

    try:
        require_extra("sglang")
    except ImportError as exc:
        print(f"leyline-server: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    from leyline_server.engines.sglang.launch import sglang_argv, sglang_help

    if "-h" in argv or "--help" in argv:
        print(parser.format_help())
        print("SGLang's flags, passed through unchanged (--model-path, --context-length, --mem-fraction-static,")
        print("--chunked-prefill-size, --max-running-requests and an explicit --dtype are handed to SGLang too;")
        print("--host, --port, --api-key serve Leyline's API):\n")
        print(sglang_help())
        raise SystemExit(0)
    dtype = known.dtype if any(a == "--dtype" or a.startswith("--dtype=") for a in argv) else None
    for flag in ("--chunked-prefill-size", "--max-running-requests"):  # SGLang's own flags of these names
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            extra += [flag, str(getattr(known, flag[2:].replace("-", "_")))]
    extra += sglang_kv
    known.engine_args = sglang_argv(known.model, extra, known.context_length, known.mem_fraction_static, dtype)
    return known


def _names_sglang(argv: list[str]) -> bool:
    """Whether the command line asks for ``--engine sglang``."""
    pairs = zip(argv, argv[1:], strict=False)
    return "--engine=sglang" in argv or any(a == "--engine" and b == "sglang" for a, b in pairs)


def _split_flag(argv: list[str], flag: str) -> tuple[list[str], list[str]]:
    """(``argv`` without ``flag`` and its value, the flag and its value as given)."""
    rest: list[str] = []
    taken: list[str] = []
    items = iter(argv)
    for a in items:
        if a == flag:
            taken += [a, next(items, "")]
        elif a.startswith(flag + "="):
            taken.append(a)
        else:
            rest.append(a)
    return rest, taken


def kv_budget_mb(args: argparse.Namespace) -> float | None:
    """The KV pool size: ``--mem-fraction-static`` of available memory, else ``--kv-budget-mb``,
    else ``None`` (the engine sizes it from the machine for the served context)."""
    fraction = args.mem_fraction_static
    if fraction is None:
        return None if args.kv_budget_mb is None else float(args.kv_budget_mb)
    if not 0 < fraction < 1:
        raise ValueError("--mem-fraction-static must lie in (0, 1)")
    from leyline_server.engines.kv_budget import available_bytes

    return fraction * available_bytes() / 2**20


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """Every engine-relevant flag of ``args`` as one :class:`EngineConfig` (``ValueError`` if one is out of range)."""
    names = args.served_model_name or ()
    return EngineConfig(
        engine=args.engine,
        model=args.model,
        served_name=names[0] if names else None,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        preset_layers=args.preset_layers,
        kv_budget_mb=kv_budget_mb(args),
        kv_budget_from="--kv-budget-mb" if args.mem_fraction_static is None else "--mem-fraction-static",
        context_length=args.context_length,
        prefix_cache=not args.disable_prefix_cache,
        swap_space_gb=float(args.swap_space),
        engine_args=tuple(getattr(args, "engine_args", ())),
        rotation_budget=args.rotation_budget,
        canary_tolerance=args.canary_tolerance,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        threads=args.threads,
        threads_batch=args.threads_batch,
        flash_attn=args.flash_attn,
    )


def server_config(args: argparse.Namespace) -> Any:
    """The service's settings and limits from the flags (``ValueError`` for a bad one)."""
    from leyline_server.api.config import ServerConfig

    keys = set(args.api_key) | {k.strip() for k in os.environ.get("LEYLINE_API_KEYS", "").split(",") if k.strip()}
    return ServerConfig(
        model_name=args.model,
        served_model_names=tuple(args.served_model_name or ()),
        api_keys=frozenset(keys),
        isolate_keys=args.isolate_keys,
        auto_splice=args.auto_splice,
        client_edits=args.client_edits,
        volatile_system_lines=volatile_lines(args.volatile_system_line),
        max_context_tokens=args.context_length,
        max_sessions=args.max_sessions,
        max_sessions_per_key=args.max_sessions_per_key,
        session_ttl_s=args.session_ttl,
        responses_per_key=args.max_responses_per_key,
        responses_tokens_per_key=args.max_response_tokens_per_key,
        responses_bytes_per_key=int(args.max_response_mb_per_key * 2**20),
        responses_ttl_s=args.response_ttl,
        default_max_tokens=args.default_max_tokens,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_messages=args.max_messages,
        render_timeout_s=args.render_timeout,
        compile_timeout_s=args.compile_timeout,
        max_concurrent_per_key=args.max_concurrent_per_key,
        kv_share_per_key=args.kv_share_per_key,
        admission_timeout_s=args.admission_timeout,
        stream_stall_timeout_s=args.stream_stall_timeout,
        sampling_defaults=args.sampling_defaults,
        stream_keepalive_s=args.stream_keepalive,
    )


def volatile_lines(flags: list[str] | None) -> tuple[str, ...]:
    """``--volatile-system-line`` as the config's prefixes: the default when unset, none for ``''``."""
    from leyline_server.api.config import ServerConfig

    if flags is None:
        return ServerConfig.volatile_system_lines
    return tuple(prefix for prefix in flags if prefix)


def build_service(args: argparse.Namespace) -> Any:
    """Check the limits, build the engine (:func:`~leyline_server.engines.factory.build_engine`), wrap both."""
    from leyline_server.api.service import LeylineService
    from leyline_server.engines.factory import build_engine

    config = server_config(args)  # before the model loads: a bad flag fails at once
    engine, tokenizer = build_engine(engine_config(args))
    return LeylineService(engine, tokenizer, config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        service = build_service(args)
    except (ValueError, ImportError) as exc:
        print(f"leyline-server: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from leyline_server.api.app import create_app

    info = service.engine.info
    logging.getLogger("leyline").info(
        "serving %s as %s on http://%s:%d (engine %s, context %d tokens, KV pool %d tokens, auth %s, "
        "key isolation %s, auto-splice %s, client edits %s)",
        args.model,
        ", ".join(service.config.names),
        args.host,
        args.port,
        info.engine,
        service.context_tokens,
        info.kv_capacity_tokens,
        "on" if service.config.api_keys else "off",
        "on" if service.config.isolated else "off",
        "on" if args.auto_splice else "off",
        service.config.client_edits,
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
