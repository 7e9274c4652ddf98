"""The only module that touches transformers' cache API (tested with transformers 5.24).

transformers 5.x caches, per layer, ``keys``/``values`` tensors ``[batch, heads, tokens, dim]``.
DeepSeek MLA caches the normalized latent as "keys" ``[B, 1, T, kv_lora_rank]`` and the
post-RoPE k_pe as "values" ``[B, 1, T, qk_rope_head_dim]``; our pool row is ``[latent | k_pe]``.
GQA caches post-RoPE K and V per kv head. The forward keyword is ``cache=`` (``past_key_values=``
is deprecated and goes away in 5.40).

A forward runs over a :class:`PoolMirrorCache`: one layer object per model layer that appends the
new states to a :class:`~leyline_server.engines.embedded.mirror.Mirror` (contiguous, no gather)
and writes them through to the pool's rows. The layers are full-attention caches; for a model
with sliding-window layers, transformers builds the sliding mask from the config's layer types,
so full KV plus that mask gives the model's own logits (tested past the window).

Several sequences in one forward (:func:`forward_packed`, the scheduler's batched step): their
new tokens are packed into one row ``[1, N]`` (each with its own position), so every projection
and MLP runs once over all of them; attention runs per sequence over that sequence's own mirror,
through the model's own attention function (``eager`` or ``sdpa``) called once per sequence with
the causal mask transformers would build for it alone (:mod:`.packed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from leyline_server.engines.embedded.mirror import MirrorStore
from leyline_server.engines.embedded.pool import SlotPool

__all__ = ["forward_with_slots", "layer0_keys", "check_layer_types", "SERVABLE_LAYER_TYPES"]

SERVABLE_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class _MirrorLayer(CacheLayerMixin):
    """One layer's cache over a mirror: appends at ``start``, writes new rows through to the pool."""

    is_sliding = False
    is_croppable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, layer: int, start: int, pool: SlotPool,
                 slots: torch.Tensor) -> None:  # fmt: skip
        super().__init__()
        self.kbuf, self.vbuf, self.layer, self.pool, self.slots = keys, values, layer, pool, slots
        self.length = start
        self.keys = keys[None, :, :start]
        self.values = values[None, :, :start]
        self.is_initialized = True
        self.device = keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the mirror is allocated before the forward."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[1, H, t, D]`` states; write them to the pool; return views of the whole sequence."""
        if key_states.shape[0] != 1:
            raise ValueError("PoolMirrorCache serves batch size 1")
        a, b = self.length, self.length + key_states.shape[-2]
        self.kbuf[:, a:b].copy_(key_states[0])
        self.vbuf[:, a:b].copy_(value_states[0])
        k_rows, v_rows = key_states[0].transpose(0, 1), value_states[0].transpose(0, 1)  # [t, H, D]
        pool = self.pool
        if pool.layout.mla_latent:
            pool.keys[self.layer].index_copy_(0, self.slots, torch.cat([k_rows, v_rows], dim=-1).to(pool.dtype))
        else:
            assert pool.values is not None
            pool.keys[self.layer].index_copy_(0, self.slots, k_rows.to(pool.dtype))
            pool.values[self.layer].index_copy_(0, self.slots, v_rows.to(pool.dtype))
        self.length = b
        self.keys, self.values = self.kbuf[None, :, :b], self.vbuf[None, :, :b]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, kv offset) for the mask: the whole sequence, from 0."""
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        """Tokens already cached in this layer."""
        return self.length

    def get_max_length(self) -> int:
        """No fixed maximum (the mirror grows)."""
        return -1


class PoolMirrorCache(Cache):
    """A transformers :class:`Cache` for one forward: every layer appends to a mirror at ``start``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, pool: SlotPool, start: int, slots: torch.Tensor):
        slots = slots.to(torch.int64).to(pool.keys.device)
        layers: list[Any] = [_MirrorLayer(keys[i], values[i], i, start, pool, slots) for i in range(pool.layout.layers)]
        super().__init__(layers=layers)


def check_layer_types(config: Any) -> list[str]:
    """The config's cache layer types; ``ValueError`` naming any a slot pool cannot serve.

    Full and sliding-window attention are served (sliding with full KV: the mask does the
    windowing). Chunked attention, linear attention / state-space layers and KV-sharing layers are
    refused.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    bad = sorted({str(t) for t in types if t not in SERVABLE_LAYER_TYPES})
    if bad:
        raise ValueError(
            f"{getattr(config, 'model_type', '?')}: cache layers {bad} cannot be served from a slot pool "
            f"(the embedded engine serves {sorted(SERVABLE_LAYER_TYPES)})"
        )
    return [str(t) for t in types]


@torch.no_grad()
def forward_with_slots(
    model: Any,
    pool: SlotPool,
    mirrors: MirrorStore,
    context: torch.Tensor,
    tokens: Sequence[int],
    positions: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Run ``tokens`` at ``positions`` attending to ``context`` slots; store their KV in ``slots``.

    Returns the logits of the last new token, ``[1, vocab]`` fp32 (the engine never needs the
    others: computing them all costs 15-20 % of a long prefill).
    """
    if len(tokens) != slots.numel() or len(tokens) != positions.numel():
        raise ValueError("tokens, positions and slots must have the same length")
    mirror = mirrors.acquire(context, len(tokens))
    start = mirror.length
    cache = PoolMirrorCache(mirror.keys, mirror.values, pool, start, slots)
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=pool.keys.device)
    out = model(
        input_ids=ids, position_ids=positions[None].to(ids.device), cache=cache, use_cache=True, logits_to_keep=1
    )
    mirror.commit(slots, pool.generation, start)  # only now does the mirror own the new rows
    return out.logits[0].float()


@torch.no_grad()
def layer0_keys(model: Any, tokens: list[int], positions: torch.Tensor, latent: int) -> torch.Tensor:
    """Layer-0 cache rows ``[n, H, D]`` of ``tokens`` each at its own position (the canary).

    Layer-0 keys depend only on token and position, so each token is run alone (a batch of
    one-token sequences) through the embedding and the first decoder layer.
    """
    from transformers import DynamicCache

    if not tokens:
        raise ValueError("layer0_keys needs at least one token")
    inner = model.model
    ids = torch.tensor(tokens, dtype=torch.long)[:, None]
    pos = positions.to(torch.long)[:, None]
    hidden = inner.embed_tokens(ids)
    cache = DynamicCache(config=model.config)
    kinds = getattr(model.config, "layer_types", None)
    if kinds and hasattr(inner.rotary_emb, f"{kinds[0]}_inv_freq"):  # per-kind RoPE (Gemma 3)
        position_embeddings = inner.rotary_emb(hidden, pos, kinds[0])
    else:
        position_embeddings = inner.rotary_emb(hidden, pos)
    inner.layers[0](
        hidden,
        attention_mask=None,
        position_ids=pos,
        cache=cache,
        use_cache=True,
        position_embeddings=position_embeddings,
    )
    entry: Any = cache.layers[0]
    if latent:
        return torch.cat([entry.keys, entry.values], dim=-1)[:, :, 0].float()  # [n, 1, D]
    return entry.keys[:, :, 0].float()  # [n, H, D]
