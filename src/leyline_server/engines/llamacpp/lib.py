"""Typed wrappers over llama-cpp-python's low-level C API (``llama_cpp``, pinned to 0.3.36).

The high-level ``llama_cpp.Llama`` is not used: it silently ignores ``n_seq_max`` and
``kv_unified``, which the engine needs (many sequences in one unified KV pool, so that
``llama_memory_seq_cp`` can share cells between them). Everything here is the C API 1:1:

* :class:`LlamaModel` — the weights, the vocabulary and the GGUF metadata;
* :class:`LlamaContext` — one context: a unified KV pool of ``n_ctx`` cells shared by up to
  ``n_seq_max`` sequences, one-ubatch ``decode`` calls, the sequence operations, the state API;
* :class:`TokenSampler` — llama.cpp's own sampler chain over a logits row (OpenAI semantics);
* :func:`logprobs` — log-softmax of the raw logits (before temperature and penalties).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp as L
import numpy as np

from leyline_server.contract.values import SamplingParams, TokenLogprob

__all__ = [
    "KV_TYPES",
    "ContextConfig",
    "LlamaContext",
    "LlamaModel",
    "TokenSampler",
    "default_threads",
    "init_backend",
    "logprobs",
]

KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # ggml_type ids of the KV cache
GREEDY_BELOW = 1e-4  # (near-)zero temperature is greedy, as on the embedded engine
_U8P = ctypes.POINTER(ctypes.c_uint8)
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # struct llama_token_data
_ready = False


@L.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet(level: int, text: bytes, user_data: Any) -> None:  # a module-level reference keeps it alive
    return None


def init_backend(quiet: bool = True) -> None:
    """Initialise llama.cpp once per process (and silence its log on stderr)."""
    global _ready
    if not _ready:
        L.llama_backend_init()
        if quiet:
            L.llama_log_set(_quiet, ctypes.c_void_p(0))
        _ready = True


class LlamaModel:
    """A GGUF model loaded on the CPU: weights, vocabulary, metadata."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        init_backend()
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        self.path = str(path)
        self.ptr = L.llama_model_load_from_file(self.path.encode(), params)
        if not self.ptr:
            raise ValueError(f"llama.cpp could not load {self.path!r} (not a GGUF model it supports)")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_layer = int(L.llama_model_n_layer(self.ptr))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self.ptr))
        arch = self.meta("general.architecture") or "llama"
        n_embd, n_head = int(L.llama_model_n_embd(self.ptr)), int(L.llama_model_n_head(self.ptr))
        head_k = int(self.meta(f"{arch}.attention.key_length") or n_embd // max(n_head, 1))
        head_v = int(self.meta(f"{arch}.attention.value_length") or head_k)
        self.head_k = head_k
        self.kv_row = (head_k + head_v) * int(L.llama_model_n_head_kv(self.ptr))  # K+V elements per layer
        self.rope_type = int(L.llama_model_rope_type(self.ptr))  # llama_rope_type: NONE -1, NORM 0, NEOX 2, ...
        self.size_bytes = int(L.llama_model_size(self.ptr))  # the weights every decode step reads
        self.n_swa = int(L.llama_model_n_swa(self.ptr))  # sliding window of its local layers (0: none)

    def cell_bytes(self, kv_type: str) -> int:
        """KV bytes one cache cell takes over all layers with ``kv_type`` (float32, float16, bfloat16)."""
        return self.n_layer * self.kv_row * (4 if kv_type == "float32" else 2)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string (``None`` if absent)."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", errors="replace")

    def tokenize(self, text: str, parse_special: bool = True) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (no BOS added; control tokens parsed)."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, False, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (control tokens rendered)."""
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def eos_tokens(self) -> tuple[int, ...]:
        """Every token that ends generation, as llama.cpp decides it (``llama_vocab_is_eog``).

        The end-of-sequence and end-of-turn tokens, and the others llama.cpp recognises by their
        text: Qwen's GGUF names ``<|im_end|>`` its end of sequence, but the model also ends turns
        with ``<|endoftext|>`` (its ``generation_config`` lists both), which would otherwise be
        decoded as text and generation would run on.
        """
        ids = [int(L.llama_vocab_eos(self.vocab)), int(L.llama_vocab_eot(self.vocab))]
        ids += [t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t)]
        return tuple(dict.fromkeys(t for t in ids if 0 <= t < self.n_vocab))

    def close(self) -> None:
        """Free the weights."""
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None


def default_threads(decode: int | None = None, prompt: int | None = None) -> tuple[int, int]:
    """(decode threads, prompt threads): each as given, else every core (llama.cpp's own server does the
    same; one decode thread on 2 cores decoded SmolLM2 at 0.6x llama-server's speed)."""
    cores = os.cpu_count() or 2
    return decode or cores, prompt or cores


@dataclass(frozen=True)
class ContextConfig:
    """How to build a context: cells, sequences, batch, threads, KV dtype, flash attention."""

    n_ctx: int
    n_seq_max: int = 256
    n_batch: int = 512
    n_threads: int = 1
    n_threads_batch: int = 2
    kv_type: str = "float16"
    flash_attn: bool | None = None  # None: llama.cpp decides (on for the CPU)


class LlamaContext:
    """One llama.cpp context with a unified KV pool (every sequence shares ``n_ctx`` cells)."""

    def __init__(self, model: LlamaModel, config: ContextConfig, eval_callback: Any = None) -> None:
        """``eval_callback``: llama.cpp's ``cb_eval`` (a ``ggml_backend_sched_eval_callback``), kept alive here."""
        if not 1 <= config.n_seq_max <= L.llama_max_parallel_sequences():
            raise ValueError(f"n_seq_max must lie in [1, {L.llama_max_parallel_sequences()}]")
        params = L.llama_context_default_params()
        params.n_ctx = config.n_ctx
        params.n_batch = params.n_ubatch = config.n_batch
        params.n_seq_max = config.n_seq_max
        params.kv_unified = True  # seq_cp of a partial range across streams aborts the process otherwise
        params.n_threads = config.n_threads
        params.n_threads_batch = config.n_threads_batch
        params.type_k = params.type_v = KV_TYPES[config.kv_type]
        params.flash_attn_type = {None: -1, False: 0, True: 1}[config.flash_attn]
        params.no_perf = True
        if eval_callback is not None:
            params.cb_eval = eval_callback
        self._eval_callback = eval_callback
        self.model = model
        self.config = config
        self.ptr = L.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ValueError(f"llama.cpp could not create a context with {config}")
        self.mem = L.llama_get_memory(self.ptr)
        self.shift_pending = False
        self.n_ctx = int(L.llama_n_ctx(self.ptr))
        self.n_batch = config.n_batch
        self._batch = L.llama_batch_init(config.n_batch, 0, 1)
        n = config.n_batch
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._n_seq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        self._n_seq[:] = 1
        self.calls = 0  # llama_decode calls so far (output rows live until the next one)

    @property
    def can_shift(self) -> bool:
        """Whether llama.cpp can shift positions of this model's cache (``llama_memory_can_shift``)."""
        return bool(L.llama_memory_can_shift(self.mem))

    def decode(self, entries: Sequence[tuple[int, int, int]], want_logits: bool) -> int:
        """Decode ``(seq, token, pos)`` triples (at most ``n_batch``) in one call; llama.cpp's return code.

        0: done; 1: no KV slot (the cache is unchanged); negative: a bad batch. Only the last
        triple's logits are kept when ``want_logits``.
        """
        return self.decode_rows(entries, (len(entries) - 1,) if want_logits else ())

    def decode_rows(self, entries: Sequence[tuple[int, int, int]], logit_rows: Sequence[int]) -> int:
        """Decode ``(seq, token, pos)`` triples (at most ``n_batch``) in one call, keeping the logits
        of the triples at the indices ``logit_rows``; llama.cpp's return code (as :meth:`decode`).

        After a successful call, :meth:`logits_view` of a triple's index reads its row until the
        next call (``calls`` counts them, so a reader can tell its row is gone).
        """
        n = len(entries)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a batch holds 1..{self.n_batch} tokens, not {n}")
        batch = self._batch
        for i, (seq, token, pos) in enumerate(entries):
            batch.seq_id[i][0] = seq
            self._tokens[i] = token
            self._pos[i] = pos
        self._logits[:n] = 0
        self._logits[list(logit_rows)] = 1
        batch.n_tokens = n
        self.calls += 1  # every output row of the previous call is gone, whatever the outcome
        rc = int(L.llama_decode(self.ptr, batch))
        if rc == 0:
            self.shift_pending = False  # llama.cpp re-rotated every moved key first
        return rc

    def last_logits(self) -> np.ndarray:
        """A float32 copy of the last decoded output row."""
        return self.logits_view().copy()

    def logits_view(self, i: int = -1) -> np.ndarray:
        """The output row of the last call's triple ``i`` (-1: the last output row) in llama.cpp's own
        buffer: changing it changes what is sampled; the next call overwrites it."""
        row = L.llama_get_logits_ith(self.ptr, i)
        if not row:
            raise ValueError(f"the last llama_decode call kept no logits for index {i}")
        return np.ctypeslib.as_array(row, shape=(self.model.n_vocab,))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Remove ``seq`` from the cells at positions ``[p0, p1)`` (cells no sequence holds are freed)."""
        if not L.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise RuntimeError(f"llama.cpp refused seq_rm({seq}, {p0}, {p1})")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``dst`` hold ``src``'s cells at ``[p0, p1)`` too (shared cells, nothing copied)."""
        L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move ``seq``'s cells at ``[p0, p1)`` by ``delta`` (keys re-rotated at the next decode).

        Until then ``shift_pending`` is set: the state API would serialise the keys unrotated.
        """
        L.llama_memory_seq_add(self.mem, seq, p0, p1, delta)
        self.shift_pending = True

    def pos_max(self, seq: int) -> int:
        """The highest position ``seq`` holds (-1 when empty)."""
        return int(L.llama_memory_seq_pos_max(self.mem, seq))

    def state_size(self, seq: int) -> int:
        """Bytes :meth:`state_get` would return for ``seq``."""
        return int(L.llama_state_seq_get_size(self.ptr, seq))

    def state_get(self, seq: int, into: np.ndarray | None = None, size: int | None = None) -> np.ndarray:
        """``seq``'s cells serialised (positions, every layer's K and V) into a new uint8 array, or
        into the front of ``into`` when it is large enough (a view of it is returned). ``size``:
        :meth:`state_size` of ``seq`` when the caller has it (computing it walks the cells again)."""
        n = L.llama_state_seq_get_size(self.ptr, seq) if size is None else size
        if into is not None and into.nbytes >= n:
            buf = into[:n]
        else:
            buf = np.empty(n, dtype=np.uint8)  # not zeroed, not copied again: 5x faster than a ctypes array
        written = L.llama_state_seq_get_data(self.ptr, buf.ctypes.data_as(_U8P), n, seq)
        if written != n:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {n} bytes")
        return buf

    def state_set(self, blob: np.ndarray, seq: int) -> bool:
        """Restore a :meth:`state_get` blob into fresh cells of ``seq`` (emptied first); ``False`` if no room."""
        return bool(L.llama_state_seq_set_data(self.ptr, blob.ctypes.data_as(_U8P), len(blob), seq))

    def clear(self) -> None:
        """Empty the whole pool (every sequence); new cells are then placed from index 0 again."""
        L.llama_memory_clear(self.mem, False)

    def close(self) -> None:
        """Free the batch and the context."""
        if self.ptr:
            L.llama_batch_free(self._batch)
            L.llama_free(self.ptr)
            self.ptr = None


class TokenSampler:
    """llama.cpp's sampler chain for one request, applied to logits rows the engine kept.

    Order as on the embedded engine: logit_bias, repetition/presence/frequency penalties (over
    the tokens generated so far: SGLang's repetition penalty, then ``count * frequency +
    (count > 0) * presence`` as OpenAI defines them), then greedy (temperature ~0 or top-k 1) or
    temperature, top-k, top-p, min-p and a seeded draw.
    """

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if params.logit_bias:
            bias = (L.llama_logit_bias * len(params.logit_bias))()
            for i, (token, value) in enumerate(params.logit_bias.items()):
                bias[i] = L.llama_logit_bias(token, value)
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_logit_bias(n_vocab, len(bias), bias))
        if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
            window = max(params.max_tokens, 1)
            penalties = L.llama_sampler_init_penalties(
                n_vocab, window, params.repetition_penalty, params.frequency_penalty, params.presence_penalty
            )
            L.llama_sampler_chain_add(self.chain, penalties)
        if params.temperature < GREEDY_BELOW or params.top_k == 1:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_temp(params.temperature))
            if params.top_k > 0:
                L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_min_p(params.min_p, 1))
            seed = L.LLAMA_DEFAULT_SEED if params.seed is None else params.seed % L.LLAMA_DEFAULT_SEED
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_dist(seed))
        self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._array = L.llama_token_data_array()

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token from a float32 logits row and record it (penalties count it)."""
        data = self._data
        data["id"] = self._ids
        data["logit"] = logits
        data["p"] = 0.0
        array = self._array
        array.data = data.ctypes.data_as(L.llama_token_data_p)  # type: ignore[assignment]  # a pointer field
        array.size = len(data)
        array.selected = -1
        array.sorted = False
        L.llama_sampler_apply(self.chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise RuntimeError("llama.cpp's sampler selected nothing")
        token = int(data["id"][array.selected])
        L.llama_sampler_accept(self.chain, token)
        return token

    def sample_last(self, ctx: LlamaContext) -> int:
        """Pick the next token from ``ctx``'s last decoded row in place (no copy) and record it.

        The same chain as :meth:`sample` applied by llama.cpp itself (``llama_sampler_sample``
        fills the candidates and accepts the token in C): the per-token Python work is one call.
        """
        return self.sample_at(ctx, -1)

    def sample_at(self, ctx: LlamaContext, i: int) -> int:
        """:meth:`sample_last` for the output row of the last call's triple ``i`` (any of a batch's rows)."""
        return int(L.llama_sampler_sample(self.chain, ctx.ptr, i))

    def close(self) -> None:
        """Free the chain (and the samplers in it)."""
        if self.chain:
            L.llama_sampler_free(self.chain)
            self.chain = None


def logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, list[TokenLogprob]]:
    """``token``'s log-probability under the raw logits, and the ``top`` most likely tokens."""
    shifted = logits.astype(np.float64) - float(logits.max())
    logp = shifted - np.log(np.exp(shifted).sum())
    best: list[TokenLogprob] = []
    if top:
        idx = np.argpartition(-logp, top - 1)[:top]
        idx = idx[np.argsort(-logp[idx], kind="stable")]
        best = [TokenLogprob(int(i), float(logp[i])) for i in idx]
    return float(logp[token]), best
