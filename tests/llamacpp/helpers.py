"""Helpers for the llama.cpp engine tests: tiny GGUF models, engines, splices, logits comparisons."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.llamacpp.convert import write_llama_gguf
from leyline_server.engines.llamacpp.engine import LlamaCppEngine
from leyline_server.engines.llamacpp.lib import LlamaModel
from leyline_server.splice import splice

SCOPE = CacheScope(private="test-session")
BASE = [(37 * i + 11) % 1000 + 7 for i in range(600)]


@functools.cache
def hf_model(layers: int):
    """The tiny llama-style transformers model (``tiny_config("llama", layers)``, seed 0)."""
    from leyline_server.tiny_models import build_model, tiny_config

    return build_model(tiny_config("llama", layers=layers))


@functools.cache
def tiny_gguf(layers: int, folder: str) -> Path:
    """``hf_model(layers)`` written as a float32 GGUF with the project's tiny tokenizer."""
    from leyline_sdk.render.tiny_tokenizer import tiny_tokenizer_path

    return write_llama_gguf(hf_model(layers), tiny_tokenizer_path(), Path(folder) / f"tiny-llama-{layers}l.gguf")


def engine(path: Path, n_ctx: int = 4096, kv_type: str = "float32", **kw) -> LlamaCppEngine:
    """An engine on ``path``: float32 cache and no flash attention by default (the exact setting)."""
    return LlamaCppEngine(LlamaModel(path), n_ctx=n_ctx, kv_type=kv_type, threads=(1, 2), **kw)


def prefill(eng: LlamaCppEngine, tokens, previous=None, scope: CacheScope = SCOPE):
    """(handle, last logits, reused)."""
    result = eng.prefill(tokens, scope, previous=previous)
    return result.handle, result.last_logits, result.reused


def run_splice(eng, handle, directives, strict=False, blocks=None, **kw):
    """The shared executor on the llama.cpp engine: (new handle, report)."""
    request = SpliceRequest(directives, kw.get("base_length"), kw.get("base_digest"), strict, kw.get("prompt"))
    if blocks:
        request = SpliceRequest(directives, None, None, strict, kw.get("prompt"), blocks)
    return splice(eng, handle, request)


def fresh_logits(path: Path, tokens, layers_kv: str = "float32") -> np.ndarray:
    """Logits after a prefill of ``tokens`` from nothing, on a new engine (the oracle)."""
    eng = engine(path, kv_type=layers_kv)
    try:
        return prefill(eng, tokens, scope=CacheScope())[1]
    finally:
        eng.close()


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference."""
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(softmax(p) || softmax(q))."""
    p = np.exp(p_logits.astype(np.float64) - p_logits.max())
    p /= p.sum()
    q = np.exp(q_logits.astype(np.float64) - q_logits.max())
    q /= q.sum()
    return float(np.sum(p * (np.log(p + 1e-300) - np.log(q + 1e-300))))
