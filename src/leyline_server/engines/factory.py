"""The one place that picks and builds an engine (the CLI, the background server and tests use it)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_engine", "ENGINES"]

ENGINES = ("embedded", "sglang", "llamacpp")
_EXTRAS = {
    "sglang": "pip install 'leyline[sglang]' (GPU machines; see the README)",
    "llamacpp": "pip install 'leyline[llamacpp]' (builds llama.cpp from source, ~20 min on 2 cores)",
}


def build_engine(
    engine: str = "embedded",
    model: str = "tiny-mla",
    *,
    kv_budget_mb: float = 256.0,
    dtype: str = "float32",
    preset_layers: int = 2,
    max_context_tokens: int | None = None,
    served_name: str | None = None,
) -> tuple[Any, Any]:
    """(engine implementing :class:`~leyline_server.engines.base.Engine`, its tokenizer).

    Raises ``ValueError`` for an unknown engine or model, ``ImportError`` (with the install
    command) when the engine's optional extra is missing.
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
        )
        return AsyncEmbeddedEngine(core, tokenizer), tokenizer
    if engine in _EXTRAS:
        raise ImportError(f"the {engine} engine needs its extra: {_EXTRAS[engine]}")
    raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}")
