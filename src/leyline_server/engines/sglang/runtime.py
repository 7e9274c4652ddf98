"""What a running SGLang scheduler is, as far as a splice is concerned (read inside the scheduler).

The launch refuses unsupported flags up front (:mod:`.launch`); these checks read the *resolved*
runtime — what SGLang actually built (page size raised by an attention backend, the tree, the
allocator, speculative decoding, attention DP) — and ``info`` reports them so the engine refuses
to serve rather than splice a cache it does not understand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["scheduler_facts", "scheduler_refusals", "stream_sync"]


def _data_parallel() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return bool(parallel.attn_dp_enabled) or int(parallel.num_dp_ranks) > 1
    except Exception:  # nothing published (a scheduler built by tests): the launch checks the flags
        return False


def scheduler_refusals(scheduler: Any) -> list[str]:
    """Why this scheduler's cache cannot be spliced (empty when it can)."""
    reasons = []
    if int(getattr(scheduler, "page_size", 1) or 1) != 1:
        reasons.append(f"page size {scheduler.page_size} (needs --page-size 1 and an attention backend that keeps it)")
    if getattr(scheduler, "enable_hierarchical_cache", False):
        reasons.append("hierarchical cache (--enable-hierarchical-cache)")
    spec = getattr(scheduler, "spec_algorithm", None)
    if spec is not None and not spec.is_none():
        reasons.append("speculative decoding (--speculative-algorithm)")
    tree = scheduler.tree_cache
    if type(tree).__name__ != "UnifiedRadixCache" or getattr(tree, "disable", False):
        reasons.append(f"tree cache {type(tree).__name__} (only SGLang's default UnifiedRadixCache)")
    elif tree.supports_swa() or tree.supports_mamba():
        reasons.append("hybrid sliding-window or Mamba caches")
    allocator = scheduler.token_to_kv_pool_allocator
    if type(allocator).__name__ != "TokenToKVPoolAllocator":
        reasons.append(f"KV allocator {type(allocator).__name__} (only the page-size-1 TokenToKVPoolAllocator)")
    if _data_parallel():
        reasons.append("data-parallel attention or DP replicas (--enable-dp-attention, --attn-dp-size, --dp-size)")
    return reasons


def scheduler_facts(scheduler: Any) -> dict[str, Any]:
    """Model facts the service needs: vocabulary, EOS tokens, context and pool sizes."""
    config = scheduler.model_config
    eos = getattr(config, "hf_eos_token_id", None) or ()
    return {
        "vocab_size": int(config.vocab_size),
        "eos_token_ids": sorted(int(t) for t in eos),
        "context_len": int(config.context_len),
        "max_req_input_len": int(getattr(scheduler, "max_req_input_len", config.context_len)),
        "max_total_num_tokens": int(scheduler.max_total_num_tokens),
    }


def stream_sync(scheduler: Any) -> Callable[[], None]:
    """Order our kernels (on the current, scheduling stream) after SGLang's in-flight forward."""
    stream = getattr(scheduler, "forward_stream", None)
    if stream is None or not torch.cuda.is_available() or not isinstance(stream, torch.cuda.Stream):
        return lambda: None

    def sync() -> None:
        torch.cuda.current_stream().wait_stream(stream)

    return sync
