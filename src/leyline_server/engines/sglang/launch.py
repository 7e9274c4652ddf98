"""Start SGLang in-process with the Leyline plugin, refusing what a splice cannot work with.

``leyline-server --engine sglang --model-path PATH [SGLang flags]``: Leyline's own flags
(``--host``, ``--port``, ``--api-key``, ``--served-model-name``, ...) serve Leyline's HTTP app;
``--model-path``, ``--context-length``, ``--mem-fraction-static`` and an explicit ``--dtype`` are
handed to SGLang too, and every other flag passes through to SGLang unchanged (SGLang's own
HTTP server is not started: its offline ``Engine`` runs the tokenizer manager in this process and
spawns the scheduler processes with :func:`.plugin.run_scheduler_process`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from leyline_server.contract.values import ModelInfo
from leyline_server.engines.config import DEFAULT_ROTATION_BUDGET
from leyline_server.rope import RopeSpec

__all__ = ["REFUSED", "build_sglang_engine", "check_server_args", "sglang_argv", "sglang_help"]


def _on(v: Any) -> bool:
    return bool(v)


def _above_one(v: Any) -> bool:
    return v is not None and int(v) > 1


def _set(v: Any) -> bool:
    return v not in (None, "", "null")


# server-args field -> (refused when, why)
REFUSED: dict[str, tuple[Any, str]] = {
    "page_size": (lambda v: v not in (None, 1), "Leyline splices token by token: page size 1 only"),
    "enable_hierarchical_cache": (_on, "HiCache moves KV to host memory behind the splice's back"),
    "hicache_storage_backend": (_set, "HiCache storage"),
    "enable_lmcache": (_on, "LMCache"),
    "enable_flexkv": (_on, "FlexKV"),
    "enable_unified_cache_external_linker": (_on, "external cache linkers"),
    "enable_hisparse": (_on, "HiSparse"),
    "speculative_algorithm": (_set, "speculative decoding (the draft model's KV would need splicing too)"),
    "enable_dp_attention": (_on, "data-parallel attention (a session's KV would live on one DP rank)"),
    "attn_dp_size": (_above_one, "data-parallel attention"),
    "dp_size": (_above_one, "data-parallel replicas"),
    "pp_size": (_above_one, "pipeline parallelism"),
    "dcp_size": (_above_one, "decode context parallelism"),
    "enable_kv_cache_sharding": (_on, "KV cache sharding"),
    "enable_prefill_cp": (_on, "prefill context parallelism"),
    "disable_radix_cache": (_on, "a splice lives in the radix cache"),
    "kv_cache_dtype": (lambda v: v not in (None, "auto", "bf16", "bfloat16"), "quantized KV cannot be rotated"),
    "enable_unified_memory": (_on, "unified-memory KV pools"),
    "enable_page_major_kv_layout": (_on, "page-major KV layout"),
    "enable_streaming_session": (_on, "streaming sessions hold KV outside the tree"),
    "enable_session_radix_cache": (_on, "session radix caches"),
    "radix_cache_backend": (_set, "custom radix cache backends"),
    "tokenizer_worker_num": (_above_one, "several tokenizer workers"),
    "disaggregation_mode": (lambda v: v not in (None, "null"), "prefill/decode disaggregation"),
    "nnodes": (_above_one, "multi-node serving"),
}
_REFUSED_ENV = {"SGLANG_USE_HND_KVCACHE": "the HND KV layout", "SGLANG_RUST_SERVER": "SGLang's Rust server"}


def _flags() -> dict[str, list[str]]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags: dict[str, list[str]] = {}
    for action in parser._actions:
        flags.setdefault(action.dest, []).extend(action.option_strings)
    return flags


def check_server_args(args: Any, flags: dict[str, list[str]] | None = None) -> list[str]:
    """Why these SGLang server args cannot serve Leyline, each naming its flag (empty: fine)."""
    flags = flags if flags is not None else _flags()
    reasons = []
    for field, (refused, why) in REFUSED.items():
        value = getattr(args, field, None)
        if refused(value):
            names = flags.get(field) or [f"--{field.replace('_', '-')}"]
            reasons.append(f"{' / '.join(names)} {value!r} is not supported ({why})")
    for var, what in _REFUSED_ENV.items():
        if os.environ.get(var, "0") not in ("", "0", "false", "False"):
            reasons.append(f"{var}={os.environ[var]} is not supported ({what})")
    return reasons


def sglang_argv(
    model: str, extra: Sequence[str], context_length: int | None, mem_fraction: float | None, dtype: str | None
) -> list[str]:
    """SGLang's command line: Leyline's model flags it shares, then the flags passed through."""
    argv = ["--model-path", model]
    if context_length is not None:
        argv += ["--context-length", str(context_length)]
    if mem_fraction is not None:
        argv += ["--mem-fraction-static", str(mem_fraction)]
    if dtype is not None:
        argv += ["--dtype", dtype]
    return argv + list(extra)


def sglang_help() -> str:
    """SGLang's own flags, as ``--help`` shows them (for ``leyline-server --engine sglang --help``)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="leyline-server --engine sglang", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser.format_help()


def _model_info(reply: dict[str, Any], name: str) -> ModelInfo:
    spec = RopeSpec.model_validate(reply["spec"])
    context = min(int(reply["context_len"]), int(reply["max_req_input_len"]), int(reply["max_total_num_tokens"]))
    return ModelInfo(
        name=name,
        vocab_size=int(reply["vocab_size"]),
        eos_token_ids=tuple(reply["eos_token_ids"]),
        max_context_tokens=context,
        kv_capacity_tokens=int(reply["max_total_num_tokens"]),
        shiftable=spec.shiftable,
        unshiftable_reason=spec.reason,
        engine="sglang",
    )


def _launch(server_args: Any) -> Any:
    from sglang.srt.entrypoints.engine import Engine

    from leyline_server.engines.sglang import plugin

    class LeylineSGLangEngine(Engine):  # type: ignore[misc, valid-type]
        run_scheduler_process_func = staticmethod(plugin.run_scheduler_process)

    return LeylineSGLangEngine(server_args=server_args)


def build_sglang_engine(
    argv: Sequence[str],
    served_name: str | None = None,
    rotation_budget: int = DEFAULT_ROTATION_BUDGET,
    canary_tolerance: float | None = None,
) -> tuple[Any, Any]:
    """(an :class:`~.serving.AsyncSGLangEngine`, the model's tokenizer) for SGLang's command line ``argv``.

    Raises ``ValueError`` naming every unsupported flag before anything starts, and after the
    launch if the scheduler reports a runtime it cannot splice (then SGLang is shut down again).
    """
    from sglang.srt.server_args import prepare_server_args

    from leyline_server.engines.sglang.client import SGLangClient
    from leyline_server.engines.sglang.serving import AsyncSGLangEngine

    server_args = prepare_server_args(list(argv))
    flags = _flags()
    reasons = check_server_args(server_args, flags)
    if not reasons:
        from sglang.srt.arg_groups.overrides import resolving_view

        server_args.resolve_once()
        reasons = check_server_args(resolving_view(server_args), flags)
    if reasons:
        raise ValueError("the sglang engine cannot run with: " + "; ".join(reasons))
    engine = _launch(server_args)
    client = SGLangClient(engine.tokenizer_manager)
    try:
        reply = client.control("info", {})
        if reply.get("refusals"):
            raise ValueError("the sglang engine cannot splice this runtime: " + "; ".join(reply["refusals"]))
        info = _model_info(reply, served_name or str(server_args.model_path))
    except BaseException:
        client.close()
        engine.shutdown()
        raise
    service_engine = AsyncSGLangEngine(
        client, info, shutdown=engine.shutdown, rotation_budget=rotation_budget, canary_tolerance=canary_tolerance
    )
    return service_engine, getattr(engine.tokenizer_manager, "tokenizer", None)
