"""The one place that picks and builds an engine (the CLI, the background server and tests use it)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from leyline_server.contract.base import Engine
from leyline_server.engines.config import ENGINES, EngineConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["build_engine", "require_extra", "ENGINES", "EngineConfig"]

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


def build_engine(config: EngineConfig) -> tuple[Engine, PreTrainedTokenizerBase]:
    """(the engine ``config`` describes, its tokenizer).

    Raises ``ValueError`` for a model that cannot be served or a context that does not fit
    (naming the flag to change), ``ImportError`` (with the install command) when the engine's
    optional extra is missing.
    """
    if config.engine == "embedded":
        from leyline_server.engines.embedded.presets import load_engine
        from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine

        core, tokenizer = load_engine(config)
        return AsyncEmbeddedEngine(core, tokenizer, **config.scheduling), tokenizer
    require_extra(config.engine)
    if config.engine == "sglang":
        from leyline_server.engines.sglang.launch import build_sglang_engine

        sglang: tuple[Any, Any] = build_sglang_engine(
            list(config.engine_args) or ["--model-path", config.model],
            served_name=config.served_name,
            rotation_budget=config.rotation_budget,
            canary_tolerance=config.canary_tolerance,
        )
        return sglang
    from leyline_server.engines.llamacpp.loader import load_llamacpp

    return load_llamacpp(config)
