"""The one place that picks and builds an engine (the CLI, the background server and tests use it)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

__all__ = ["build_engine", "require_extra", "ENGINES"]

ENGINES = ("embedded", "sglang", "llamacpp")
_EXTRAS = {
    "sglang": "pip install 'leyline[sglang]' (GPU machines; see the README)",
    "llamacpp": "pip install 'leyline[llamacpp]' (builds llama.cpp from source: ~3-5 min on 2 cores with the "
    "Makefile's CMAKE_ARGS; `make` does it)",
}


def require_extra(engine: str) -> None:
    """Raise ``ImportError`` (with the install command) unless ``engine``'s optional extra is installed."""
    module = {"sglang": "sglang", "llamacpp": "llama_cpp"}.get(engine)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ImportError(f"the {engine} engine needs its extra: {_EXTRAS[engine]}")


def build_engine(
    engine: str = "embedded",
    model: str = "tiny-mla",
    *,
    kv_budget_mb: float = 256.0,
    dtype: str = "float32",
    preset_layers: int = 2,
    max_context_tokens: int | None = None,
    served_name: str | None = None,
    engine_args: Sequence[str] = (),
    prefix_cache: bool = True,
    swap_space_gb: float = 4.0,
) -> tuple[Any, Any]:
    """(engine implementing :class:`~leyline_server.engines.base.Engine`, its tokenizer).

    Raises ``ValueError`` for an unknown engine or model, ``ImportError`` (with the install
    command) when the engine's optional extra is missing. ``engine_args``: the sglang engine's
    command line (SGLang's flags, model path included); the other engines ignore it.
    ``swap_space_gb``: host memory the llama.cpp engine parks idle sequences in (the others
    ignore it: their decode reads only the request's own KV).
    """
    if engine == "embedded":
        import torch

        from leyline_server.engines.embedded.presets import load_engine
        from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine

        core, tokenizer = load_engine(
            model,
            kv_budget_mb=kv_budget_mb,
            dtype=getattr(torch, dtype),
            layers=preset_layers,
            name=served_name or model,
            max_context_tokens=max_context_tokens,
            prefix_cache=prefix_cache,
        )
        return AsyncEmbeddedEngine(core, tokenizer), tokenizer
    if engine == "sglang":
        require_extra("sglang")
        from leyline_server.engines.sglang.launch import build_sglang_engine

        return build_sglang_engine(list(engine_args) or ["--model-path", model], served_name=served_name)
    if engine == "llamacpp":
        require_extra("llamacpp")
        from leyline_server.engines.llamacpp.loader import load_llamacpp

        return load_llamacpp(
            model,
            kv_budget_mb=kv_budget_mb,
            dtype=dtype,
            layers=preset_layers,
            name=served_name or model,
            max_context_tokens=max_context_tokens,
            prefix_cache=prefix_cache,
            park_budget_mb=swap_space_gb * 1024,
        )
    if engine in _EXTRAS:
        raise ImportError(f"the {engine} engine needs its extra: {_EXTRAS[engine]}")
    raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}")
