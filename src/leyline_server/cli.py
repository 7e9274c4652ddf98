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
import json
import logging
import os
import signal
import sys
from typing import Any

from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET, DTYPES, ENGINES, KV_CACHE_DTYPES, EngineConfig

__all__ = ["main", "build_parser", "build_service", "engine_config", "server_config", "parse_args", "kv_budget_mb"]


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model-path", "--model", dest="model", default="tiny-mla",
        help="a preset (tiny-mla, tiny-mla-v3, tiny-gqa), a checkpoint folder or a .gguf file",
    )  # fmt: skip
    group.add_argument("--served-model-name", action="append", default=None, help="name(s) clients use (repeatable)")
    group.add_argument("--engine", choices=ENGINES, default="embedded", help="where the KV cache lives")
    group.add_argument(
        "--dtype", choices=DTYPES, default="float32",
        help="the weights' dtype (embedded; passed to SGLang when given; a GGUF's weights are the file's)",
    )  # fmt: skip
    group.add_argument(
        "--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
        help="the KV cache's dtype: auto is float16 on llama.cpp (llama.cpp's default) and the weights' "
        "dtype on the embedded engine (which keeps its KV in it); with --engine sglang, SGLang's own flag",
    )  # fmt: skip
    group.add_argument("--preset-layers", type=int, default=2, help="decoder layers of a preset model")
    group.add_argument(
        "--context-length", "--max-context-tokens", dest="context_length", type=int, default=None,
        help="longest prompt + completion (default: the model's, capped by the KV pool)",
    )  # fmt: skip
    group.add_argument(  # (%(default).0s prints nothing: the help says the default, not "None")
        "--kv-budget-mb", type=float, default=None,
        help="memory for the KV pool, in MiB (default: sized from the memory available, to hold the served "
        "context twice, at least 256 MiB, at most half of what is available; logged at start)%(default).0s",
    )  # fmt: skip
    group.add_argument(
        "--disable-prefix-cache", action="store_true", help="recompute every prompt from scratch (a baseline)"
    )
    group.add_argument(
        "--mem-fraction-static", type=float, default=None,
        help="size the KV pool as this fraction of the memory available at start (overrides --kv-budget-mb)",
    )  # fmt: skip
    group.add_argument(
        "--swap-space", type=float, default=4.0,
        help="llama.cpp engine: GiB of host memory for the KV of idle sessions parked out of the pool "
        "(idle sequences in the pool slow every decode); 0 keeps them in the pool",
    )  # fmt: skip
    group.add_argument(
        "--rotation-budget", type=int, default=DEFAULT_ROTATION_BUDGET,
        help="rotations one cached key may take; a splice past it falls back (drift_budget)",
    )  # fmt: skip
    group.add_argument(
        "--chunked-prefill-size", type=int, default=256,
        help="embedded and llama.cpp engines: prefill tokens per scheduler step (a long prompt is cut into chunks "
        "that share steps with the streams decoding)",
    )  # fmt: skip
    group.add_argument(
        "--max-running-requests", type=int, default=64,
        help="embedded and llama.cpp engines: streams decoding together in one step (past it, keys take turns)",
    )  # fmt: skip
    group.add_argument(
        "--canary-tolerance", type=float, default=None,
        help="largest relative layer-0 key error a splice may show (default: by the KV dtype)",
    )  # fmt: skip


def _server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1")
    group.add_argument("--port", type=int, default=8000)
    group.add_argument("--api-key", action="append", default=[], help="accepted API key (repeatable)")
    group.add_argument(
        "--isolate-keys", action=argparse.BooleanOptionalAction, default=None,
        help="a prefix cache per API key (default: on when keys are configured)",
    )  # fmt: skip
    group.add_argument(
        "--auto-splice", action="store_true",
        help="sessions for clients that send no directives (conversations recognised, the template's edits spliced)",
    )  # fmt: skip
    group.add_argument(
        "--splice-client-edits", action="store_true",
        help="splice (amortize) the edits plain clients make to their own history, for every request "
        "(per request: the header X-Leyline-Client-Edits: amortize); approximate KV for those clients",
    )  # fmt: skip
    group.add_argument(
        "--volatile-system-line", action="append", default=None, metavar="PREFIX",
        help="drop the Messages API system prompt's lines that start with PREFIX before rendering, so "
        "conversations that differ only there share their cached prompt (repeatable; default: Claude "
        "Code's attribution line, 'x-anthropic-billing-header:'; '' keeps every line)",
    )  # fmt: skip
    group.add_argument("--max-sessions", type=int, default=4096, help="sessions kept (least recently used dropped)")
    group.add_argument("--max-sessions-per-key", type=int, default=1024, help="sessions kept per API key")
    group.add_argument("--session-ttl", type=float, default=3600.0, help="seconds an idle session is kept")
    group.add_argument(
        "--max-responses-per-key", type=int, default=256,
        help="stored Responses API responses kept per API key (least recently used dropped)",
    )  # fmt: skip
    group.add_argument(
        "--max-response-tokens-per-key", type=int, default=4_000_000,
        help="tokens (prompt + completion) of the stored responses kept per API key",
    )  # fmt: skip
    group.add_argument(
        "--max-response-mb-per-key", type=float, default=64.0,
        help="MiB of the stored responses kept per API key (their JSON: echoed fields, input items, history)",
    )  # fmt: skip
    group.add_argument("--response-ttl", type=float, default=3600.0, help="seconds an idle stored response is kept")
    group.add_argument(
        "--default-max-tokens", type=int, default=None,
        help="completion limit of a request that sets none (default: the room left in the context)",
    )  # fmt: skip
    group.add_argument(
        "--sampling-defaults", type=sampling_defaults, default=None, metavar="model|openai|JSON",
        help="what a request's unset sampling fields take: 'model' (a real model preset's upstream "
        "generation config, else OpenAI's), 'openai' (temperature 1, top_p 1) or a JSON object "
        '(e.g. \'{"temperature": 0.7, "top_k": 20}\') (default: model)',
    )  # fmt: skip
    group.add_argument("--graceful-timeout", type=float, default=30.0)
    group.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def _limit_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("limits (bounded work before admission, fair admission per API key)")
    group.add_argument("--max-body-mb", type=float, default=8.0, help="request body limit, on the bytes read")
    group.add_argument("--max-messages", type=int, default=2048, help="messages a request may hold")
    group.add_argument(
        "--render-timeout", type=float, default=10.0, help="seconds a request's chat template rendering may take"
    )
    group.add_argument(
        "--max-concurrent-per-key", type=int, default=64, help="requests one API key may have in flight (more wait)"
    )
    group.add_argument(
        "--kv-share-per-key", type=float, default=0.5,
        help="fraction of the KV pool one key's requests in flight may reserve (less when more keys are active; "
        "ignored without API keys)",
    )  # fmt: skip
    group.add_argument(
        "--admission-timeout", type=float, default=30.0,
        help="seconds a request waits for its key's share before a 429 with Retry-After",
    )  # fmt: skip
    group.add_argument(
        "--stream-stall-timeout", type=float, default=60.0,
        help="seconds a stream whose client stopped reading stays paused before it is ended (tokens kept)",
    )  # fmt: skip
    group.add_argument(
        "--stream-keepalive", type=float, default=5.0,
        help="seconds between keep-alive events (an SSE comment; Anthropic's ping) while a stream's prompt is "
        "prefilled: its opening event goes out at admission, so no client's read timeout fires on a long prompt",
    )  # fmt: skip
    group.add_argument(
        "--compile-timeout", type=float, default=10.0,
        help="seconds a request waits for its grammar (response_format, forced or strict tools) before a 400",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The parser: a ``model`` group (every flag there reaches :class:`EngineConfig`), ``server`` and ``limits``."""
    parser = argparse.ArgumentParser(
        prog="leyline-server",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_args(parser)
    _server_args(parser)
    _limit_args(parser)
    return parser


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


def sampling_defaults(text: str) -> dict[str, float] | None:
    """``--sampling-defaults``: ``model`` (None), ``openai`` ({}) or a JSON object of sampling fields."""
    from leyline_server.api.params import SAMPLING_FIELDS

    if text == "model":
        return None
    if text == "openai":
        return {}
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not 'model', 'openai' or a JSON object: {exc}") from exc
    if not isinstance(values, dict) or not all(isinstance(v, (int, float)) for v in values.values()):
        raise argparse.ArgumentTypeError("a JSON object of numbers, e.g. '{\"temperature\": 0.7}'")
    unknown = sorted(set(values) - SAMPLING_FIELDS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sampling fields {unknown}; known: {sorted(SAMPLING_FIELDS)}")
    return {k: float(v) for k, v in values.items()}


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
        splice_client_edits=args.splice_client_edits,
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
        "key isolation %s, auto-splice %s)",
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
