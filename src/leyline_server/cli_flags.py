"""``leyline-server``'s flags: the parser, its three groups and the converters its flags use.

The ``model`` group holds every flag that reaches :class:`~leyline_server.engines.config.EngineConfig`;
``server`` and ``limits`` reach :class:`~leyline_server.api.config.ServerConfig`
(:mod:`leyline_server.cli` turns the parsed flags into both).
"""

from __future__ import annotations

import argparse
import json

from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET, DTYPES, ENGINES, FLASH_ATTN, KV_CACHE_DTYPES

__all__ = ["build_parser", "sampling_defaults"]

DESCRIPTION = "serve a model with the Leyline extension on an OpenAI-compatible API"


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model-path", "--model", dest="model", default="tiny-mla",
        help="a preset (tiny-mla, tiny-mla-v3, tiny-gqa, tiny-gemma3, tiny-gptoss, smollm2-135m, "
        "a leyline-models one), a checkpoint folder or a .gguf file",
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
    _engine_tuning_args(group)


def _engine_tuning_args(group: argparse._ArgumentGroup) -> None:
    """The ``model`` group's tuning flags: splice budgets, the CPU engines' scheduler and llama.cpp's threads."""
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
        "--threads", type=int, default=None,
        help="llama.cpp engine: threads of a decode step (default: every core, as llama.cpp's server)",
    )  # fmt: skip
    group.add_argument(
        "--threads-batch", type=int, default=None,
        help="llama.cpp engine: threads of a prompt batch (default: every core)",
    )  # fmt: skip
    group.add_argument(
        "--flash-attn", choices=FLASH_ATTN, default="off",
        help="llama.cpp engine: flash attention (auto: llama.cpp decides, on for the CPU as in llama-server); on "
        "prefills long prompts faster, off decodes long contexts faster on few cores and keeps the exact oracle",
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
        "--client-edits", choices=("exact", "amortize"), default="exact",
        help="the edits plain clients make to their own history, for every request that does not say "
        "(per request: the header X-Leyline-Client-Edits): exact (recomputed from the first, the "
        "default) or amortize (spliced in place: approximate KV for those clients)",
    )  # fmt: skip
    group.add_argument(
        "--splice-client-edits", action="store_const", dest="client_edits", const="amortize",
        help="the same as --client-edits amortize (the older spelling)",
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
        help="seconds a request waits, once prefilled, for its grammar (response_format, tools; it compiles beside the "
        "prefill) before a 400",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The parser: a ``model`` group (every flag there reaches :class:`EngineConfig`), ``server`` and ``limits``."""
    parser = argparse.ArgumentParser(
        prog="leyline-server",
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_args(parser)
    _server_args(parser)
    _limit_args(parser)
    return parser


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
