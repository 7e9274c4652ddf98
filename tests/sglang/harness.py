"""A CPU stand-in for one SGLang scheduler: SGLang's REAL tree, allocator, pools, plugin and IPC types.

Everything a splice touches is SGLang 0.5.23's own code running on CPU tensors:
``UnifiedRadixCache`` (Rust or Python tree core), ``TokenToKVPoolAllocator``, ``MLATokenToKVPool``
/ ``MHATokenToKVPool``, the rotary module SGLang's model would build (``get_rope``), the msgspec
IPC types and ``Scheduler.init_request_dispatcher`` with Leyline's hook applied.

Three things are test doubles (the real server tests, ``test_server_*.py``, run SGLang's own):

* the *request* path (:meth:`Runtime.prefill`, :meth:`Runtime.generate`) does what SGLang's
  scheduler does to the tree and allocator for a request — match (at most ``len - 1`` tokens),
  lock, allocate (evicting), insert with ``prev_prefix_len`` = the match, unlock — but the KV rows
  it writes are computed by a tiny transformers model of the same shape (DeepSeek-V2 MLA or Llama
  GQA), over the whole sequence from scratch (exact KV: they do not attend to rotated rows);
* the scheduler object around the real dispatcher is a namespace with the attributes read;
* the canary's reference keys come from that tiny model (:meth:`Runtime.layer0_keys`).
"""

from __future__ import annotations

import json
from array import array
from types import SimpleNamespace
from typing import Any

import torch

from leyline_server.engines.sglang.backend import ControlError
from leyline_server.tiny_models import build_model, tiny_config

MLA = dict(kv_lora_rank=32, qk_rope_head_dim=16)
KV_HEADS, HEAD_DIM = 2, 16


def rotary_for(config: Any, kind: str, rope_scaling: dict[str, Any] | None = None) -> Any:
    """The rotary module SGLang's model builds for ``config`` (DeepSeek: interleaved; Llama: neox)."""
    import sglang.srt.layers.rotary_embedding.base as base
    import sglang.srt.layers.rotary_embedding.rope_variant as variant
    from sglang.srt.layers.rotary_embedding.factory import get_rope

    # SGLang builds rotary modules only for an accelerator or its CPU engine: take the CPU path
    base._is_cpu = True
    variant.get_device = lambda *args, **kwargs: "cpu"
    theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    dim = MLA["qk_rope_head_dim"] if kind == "mla" else HEAD_DIM
    neox = kind != "mla"
    return get_rope(dim, dim, int(config.max_position_embeddings), theta, neox, rope_scaling, torch.float32)


class _Anything:
    """Any attribute, any call: the handlers SGLang's dispatcher registers and these tests never send."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class Scheduler(SimpleNamespace):
    """The attributes of SGLang's ``Scheduler`` that the real dispatcher and Leyline's plugin read."""

    def __getattr__(self, name: str) -> Any:
        return _Anything()


class Runtime:
    """One scheduler rank on CPU: real SGLang cache classes, a tiny model for the request path."""

    def __init__(self, kind: str = "mla", pool_tokens: int = 400, core: str = "rust", layers: int = 2, **kw: Any):
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.kind = kind
        self.config = tiny_config("deepseek_v2" if kind == "mla" else "llama", layers=layers)
        self.model = build_model(self.config, seed=0)
        common = dict(size=pool_tokens, page_size=1, dtype=torch.float32, layer_num=layers, device="cpu",
                      enable_memory_saver=False)  # fmt: skip
        if kind == "mla":
            self.pool = MLATokenToKVPool(**common, **MLA)
        else:
            self.pool = MHATokenToKVPool(**common, head_num=KV_HEADS, head_dim=HEAD_DIM)
        self.allocator = TokenToKVPoolAllocator(pool_tokens, torch.float32, "cpu", kvcache=self.pool, need_sort=False)
        rows = ReqToTokenPool(size=4, max_context_len=4096, device="cpu", enable_memory_saver=False)
        self.tree = UnifiedRadixCache(
            CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=self.allocator,
                            page_size=1, tree_components=(ComponentType.FULL,), tree_core_backend=core)
        )  # fmt: skip
        self.rotary = kw.pop("rotary", None) or rotary_for(self.config, kind, kw.pop("rope_scaling", None))
        self.scheduler = self._scheduler()
        self.control("info", {})  # builds the plugin's splicer; its canary reference is this model's
        self.splicer.layer0 = self.layer0_keys

    def _scheduler(self) -> Scheduler:
        from sglang.srt.managers.scheduler import Scheduler as SGLangScheduler

        from leyline_server.engines.sglang import plugin

        plugin.register()
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.apply_hooks()
        layer0 = SimpleNamespace(self_attn=SimpleNamespace(rotary_emb=self.rotary))
        model = SimpleNamespace(model=SimpleNamespace(layers=[layer0]))
        config = SimpleNamespace(vocab_size=self.config.vocab_size, context_len=4096, hf_eos_token_id={2},
                                 hf_config=SimpleNamespace(model_type=self.config.model_type))  # fmt: skip
        sched = Scheduler(
            tree_cache=self.tree, token_to_kv_pool_allocator=self.allocator, page_size=1,
            enable_hierarchical_cache=False, spec_algorithm=SimpleNamespace(is_none=lambda: True),
            tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)), model_config=config,
            max_total_num_tokens=self.allocator.size, max_req_input_len=4096, forward_stream=None,
            _leyline_splicer=None,
        )  # fmt: skip
        SGLangScheduler.init_request_dispatcher(sched)  # SGLang's own method + Leyline's AFTER hook
        return sched

    @property
    def splicer(self) -> Any:
        """The plugin's splicer inside this scheduler (built by the first control request)."""
        return self.scheduler._leyline_splicer

    # -- the transport (control requests over SGLang's real IPC types) ----------------------------------
    def control(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Encode, dispatch through the scheduler's dispatcher, decode — as over ZMQ."""
        from sglang.srt.managers import io_struct

        from leyline_server.engines.sglang.plugin import LeylineCtlReq

        sent = LeylineCtlReq(rid=f"r-{op}", op=op, body=json.dumps(args))
        req = io_struct.msgpack_decode(io_struct.msgpack_encode(sent))
        out = io_struct.msgpack_decode(io_struct.msgpack_encode(self.scheduler._request_dispatcher(req)))
        assert out.rid == req.rid
        reply = json.loads(out.body)
        if not reply["ok"]:
            raise ControlError(reply["code"], reply["message"])
        return reply

    def post(self, op: str, args: dict[str, Any]) -> None:
        """A control request whose reply is dropped."""
        self.control(op, args)

    # -- the request path (test double for SGLang's batches) ----------------------------------------------
    def key(self, tokens: list[int], ns: str | None) -> Any:
        """SGLang's radix key of a request in namespace ``ns``."""
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), extra_key=None, cache_salt=ns)

    def match(self, tokens: list[int], ns: str | None) -> tuple[int, Any]:
        """The cached prefix length of ``tokens`` in ``ns`` and its node."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        result = self.tree.match_prefix(MatchPrefixParams(key=self.key(tokens, ns)))
        return int(result.device_prefix_len), result.last_device_node

    @torch.no_grad()
    def fresh_rows(self, tokens: list[int]) -> list[torch.Tensor]:
        """Per layer ``[T, H, D]`` pool rows of a fresh forward of ``tokens`` (MHA: K then V on the last dim)."""
        out = self.model(input_ids=torch.tensor([tokens]), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        rows = []
        for layer in cache.layers:
            k, v = layer.keys[0].permute(1, 0, 2), layer.values[0].permute(1, 0, 2)  # [T, H, *]
            rows.append(torch.cat([k, v], dim=-1))
        return rows

    @torch.no_grad()
    def layer0_keys(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Layer-0 pool rows of each token alone at its position (the canary's reference here: the
        fake scheduler has no SGLang model, so the tiny model that computes the rows stands in)."""
        out = self.model(input_ids=tokens[:, None], position_ids=positions[:, None], use_cache=True)
        layer = (getattr(out, "cache", None) or out.past_key_values).layers[0]
        keys, values = layer.keys[:, :, 0], layer.values[:, :, 0]  # [n, H, *]
        return torch.cat([keys, values], dim=-1) if self.kind == "mla" else keys

    def write(self, slots: torch.Tensor, rows: list[torch.Tensor]) -> None:
        """Store per-layer rows (as :meth:`fresh_rows` gives them) into ``slots``."""
        for layer, r in enumerate(rows):
            if self.kind == "mla":
                self.pool.kv_buffer[layer][slots] = r
            else:
                self.pool.k_buffer[layer][slots] = r[..., :HEAD_DIM]
                self.pool.v_buffer[layer][slots] = r[..., HEAD_DIM:]

    def read(self, slots: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """``[T, H, D]`` rows of ``slots`` (MHA: K then V on the last dim)."""
        if self.kind == "mla":
            return self.pool.kv_buffer[layer][slots].clone()
        return torch.cat([self.pool.k_buffer[layer][slots], self.pool.v_buffer[layer][slots]], dim=-1)

    def prefill(self, tokens: list[int], ns: str | None) -> int:
        """What an SGLang request does to the cache (see the module docstring); returns its cached tokens."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        length, node = self.match(tokens[: len(tokens) - 1], ns)
        lock = self.tree.lock(node) if length else None
        try:
            prefix = (
                self.tree.path_device_indices(node).to(torch.int64) if length else torch.zeros(0, dtype=torch.int64)
            )
            need = len(tokens) - length
            slots = self.allocator.alloc(need)
            if slots is None:
                self.allocator.evict_to_free_tokens(self.tree, need)
                slots = self.allocator.alloc(need)
            assert slots is not None, "the backend's probe must keep requests within the pool"
            self.write(slots, [r[length:] for r in self.fresh_rows(tokens)])
            value = torch.cat([prefix, slots])
            self.tree.insert(InsertParams(key=self.key(tokens, ns), value=value, prev_prefix_len=length))
        finally:
            self.tree.unlock(lock)
        return length

    async def generate(self, tokens: list[int], ns: str | None, sampling: dict[str, Any], extra: dict[str, Any]) -> Any:
        """Greedy decoding as SGLang streams it (cumulative ``output_ids``); caches prompt + output[:-1]."""
        out: list[int] = []
        n = int(sampling["max_new_tokens"])
        for i in range(n):
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([tokens + out])).logits[0, -1]
            out.append(int(logits.argmax()))
            done = i == n - 1
            yield {"output_ids": list(out), "meta_info": {"finish_reason": {"type": "length"} if done else None}}
        self.prefill(tokens + out[:-1], ns)

    def close(self) -> None:
        """Nothing to stop."""

    # -- invariants -----------------------------------------------------------------------------------
    def check(self) -> None:
        """SGLang's idle invariant, and every slot free or in the tree exactly once."""
        total = self.allocator.size
        assert self.allocator.available_size() + self.tree.evictable_size() + self.tree.protected_size() == total
        owned = self.tree.all_values_flatten().tolist()
        free = self.allocator.free_pages.tolist() + self.allocator.release_pages.tolist()
        assert len(owned) == len(set(owned)), "a slot is owned twice"
        assert len(free) == len(set(free)), "a slot is free twice"
        assert not set(owned) & set(free), "a slot is both free and owned"
        assert set(owned) | set(free) == set(range(1, total + 1)), "a slot leaked"
