"""The canary on llama.cpp (:func:`run_canary`): staged layer-0 keys against the model's own keys for them.

* :func:`staged_keys` — the layer-0 keys a sequence holds at some positions, read back through
  the state API;
* :func:`reference_keys` — the model's own layer-0 keys of tokens at positions: each token
  decoded alone in an empty sequence of the engine's context (layer-0 keys depend on nothing
  else). The decode also applies pending ``seq_add`` re-rotations before anything is read, but
  it runs every layer, attending over the pool: ~20 ms on SmolLM2 for what layer 0 settles;
* :class:`KeyProbe` — the same keys from a second, small context on the same model whose decodes
  stop as soon as layer 0's keys are in its cache (llama.cpp's ``cb_eval`` returning ``false``
  after the node that writes them): llama.cpp's own embedding, norm, projection and RoPE, the
  same cache dtype, a fraction of a millisecond of compute. :func:`verified_probe` builds it only
  where it gives exactly the keys of :func:`reference_keys` on the live contexts.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp._ggml import libggml

from leyline_server.contract.values import CanaryResult
from leyline_server.engines.llamacpp.cache import SequenceCache
from leyline_server.engines.llamacpp.lib import ContextConfig, LlamaContext, LlamaModel
from leyline_server.engines.llamacpp.stage import Stage, land
from leyline_server.engines.llamacpp.state import layer0_keys

__all__ = ["KeyProbe", "reference_keys", "run_canary", "staged_keys", "verified_probe"]

_LAYER0_KEYS = b"cache_k_l0 (view)"  # llama.cpp's node storing layer 0's keys (``ggml_set_rows`` into the cache)
_STORE_OPS = (b"SET_ROWS", b"CPY")
libggml.ggml_get_name.restype = ctypes.c_char_p
libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
libggml.ggml_op_desc.restype = ctypes.c_char_p
libggml.ggml_op_desc.argtypes = [ctypes.c_void_p]


def reference_keys(
    cache: SequenceCache, positions: Sequence[int], tokens: Sequence[int], references: Sequence[int]
) -> np.ndarray | None:
    """The model's own layer-0 keys of ``tokens`` at ``positions`` (the first ``len(references)``), or ``None``.

    Each token is decoded alone in an empty sequence at its position (empty sequences accept any
    start; layer-0 keys depend on nothing else), which also applies pending ``seq_add``
    re-rotations. ``None`` when the state format cannot be read (the canary is then unavailable).
    """
    ctx = cache.ctx
    pairs = list(zip(positions, tokens, strict=True))[: len(references)]
    try:
        for ref in references:
            ctx.seq_rm(ref)
        cache.decode_batch([(references[i], t, p) for i, (p, t) in enumerate(pairs)], want_logits=False)
        return np.stack([layer0_keys(ctx.state_get(references[i]))[1][0] for i in range(len(pairs))])
    except ValueError:
        return None
    finally:
        for ref in references:
            ctx.seq_rm(ref)


def staged_keys(cache: SequenceCache, seq: int, positions: Sequence[int], scratch: int) -> np.ndarray | None:
    """The layer-0 keys ``seq`` holds at ``positions``, read back through the state API (or ``None``)."""
    ctx = cache.ctx
    try:
        ctx.seq_rm(scratch)
        for p in positions:
            ctx.seq_cp(seq, scratch, p, p + 1)
        cell_pos, rows = layer0_keys(ctx.state_get(scratch))
    except ValueError:
        return None
    finally:
        ctx.seq_rm(scratch)
    by_pos = {int(p): rows[i] for i, p in enumerate(cell_pos)}
    if any(p not in by_pos for p in positions):
        return None
    return np.stack([by_pos[p] for p in positions])


def run_canary(
    cache: SequenceCache,
    probe: KeyProbe | None,
    stage: Stage,
    positions: Sequence[int],
    tokens: Sequence[int],
    tolerance: float,
    references: Sequence[int],
    scratch: int,
) -> CanaryResult:
    """The canary of ``stage``: its layer-0 keys at ``positions`` (at most one per sequence of
    ``references``) against the model's own keys for ``tokens``, the largest error relative to
    the largest reference value.

    The reference comes from ``probe`` unless a ``seq_add`` re-rotation is pending: then from a
    decode in the pool, which applies it first (before the moved cells land: a short pool).
    """
    if not positions:
        return CanaryResult(False)
    n = min(len(positions), len(references))
    positions, tokens = list(positions)[:n], list(tokens)[:n]
    if probe is not None and not cache.ctx.shift_pending:
        expected = probe.keys(positions, tokens)
    else:
        expected = reference_keys(cache, positions, tokens, references)
    land(cache, stage)
    actual = staged_keys(cache, stage.entry.seq, positions, scratch)
    if expected is None or actual is None:
        return CanaryResult(False)
    error = float(np.abs(actual - expected).max()) / max(float(np.abs(expected).max()), 1e-6)
    return CanaryResult(True, error, tolerance)


class KeyProbe:
    """A small context on ``like``'s model computing layer-0 keys only (see the module docstring).

    One empty sequence per token (``seqs`` of them), 256 cells, the KV dtype, flash-attention
    setting and threads of ``like``. :attr:`stops` counts decodes that did stop after layer 0
    (one that did not ran to the end: the same keys, the full cost).
    """

    def __init__(self, model: LlamaModel, like: ContextConfig, seqs: int) -> None:
        self.seqs = seqs
        self.stops = 0
        self._stop = False
        config = replace(like, n_ctx=256, n_seq_max=seqs, n_batch=max(seqs, 8))
        self.ctx = LlamaContext(model, config, L.ggml_backend_sched_eval_callback(self._on_node))

    def _on_node(self, tensor: Any, ask: bool, user_data: Any) -> bool:
        """``cb_eval``: ask for layer 0's key store only; once computed, stop the graph there."""
        if ask:
            return bool(libggml.ggml_get_name(tensor) == _LAYER0_KEYS and libggml.ggml_op_desc(tensor) in _STORE_OPS)
        self._stop = True
        return False

    def keys(self, positions: Sequence[int], tokens: Sequence[int]) -> np.ndarray | None:
        """Layer-0 keys of ``tokens`` at ``positions`` (at most ``seqs``) as the cache stores them, or ``None``."""
        ctx = self.ctx
        pairs = list(zip(positions, tokens, strict=True))[: self.seqs]
        self._stop = False
        try:
            if ctx.decode([(i, t, p) for i, (p, t) in enumerate(pairs)], want_logits=False) != 0:
                return None
            self.stops += self._stop
            return np.stack([layer0_keys(ctx.state_get(i))[1][0] for i in range(len(pairs))])
        except ValueError:
            return None
        finally:
            ctx.clear()  # every other layer of these cells was never computed

    def close(self) -> None:
        """Free the probe's context (not the model)."""
        self.ctx.close()


def verified_probe(model: LlamaModel, cache: SequenceCache, references: Sequence[int]) -> KeyProbe | None:
    """A :class:`KeyProbe` for ``cache``'s context if its keys equal :func:`reference_keys` exactly
    (four tokens at far-apart positions, decoded in both contexts) and it stopped early; else ``None``."""
    last = max(model.n_ctx_train - 1, 4)
    positions = [3, min(517, last), min(2752, last), last]
    tokens = [model.n_vocab // 2, model.n_vocab // 3, 7 % model.n_vocab, model.n_vocab - 1]
    n = min(len(references), len(positions))
    probe = KeyProbe(model, cache.ctx.config, n)
    try:
        want = reference_keys(cache, positions[:n], tokens[:n], references)
        got = probe.keys(positions[:n], tokens[:n])
    except BaseException:
        probe.close()
        raise
    if want is None or got is None or probe.stops != 1 or not np.array_equal(want, got):
        probe.close()
        return None
    return probe
