"""The only module that touches transformers' cache API (tested with transformers 5.24).

transformers 5.x caches, per layer, ``keys``/``values`` tensors ``[batch, heads, tokens, dim]``.
DeepSeek MLA caches the normalized latent as "keys" ``[B, 1, T, kv_lora_rank]`` and the
post-RoPE k_pe as "values" ``[B, 1, T, qk_rope_head_dim]``; our pool row is ``[latent | k_pe]``.
GQA caches post-RoPE K and V per kv head. The forward keyword is ``cache=`` (``past_key_values=``
is deprecated and goes away in 5.40).
"""

from __future__ import annotations

from typing import Any

import torch

from leyline_server.engines.embedded.pool import SlotPool

__all__ = ["forward_with_slots", "layer0_keys"]


def _build_cache(model: Any, pool: SlotPool, context: torch.Tensor) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if context.numel() == 0:
        return cache
    latent = pool.layout.mla_latent
    for layer in range(pool.layout.layers):
        rows = pool.keys[layer].index_select(0, context)  # [T, H, D]
        if latent:
            k = rows[..., :latent].permute(1, 0, 2)[None]
            v = rows[..., latent:].permute(1, 0, 2)[None]
        else:
            assert pool.values is not None
            k = rows.permute(1, 0, 2)[None]
            v = pool.values[layer].index_select(0, context).permute(1, 0, 2)[None]
        cache.update(k.contiguous(), v.contiguous(), layer)
    return cache


def _store_new(pool: SlotPool, cache: Any, slots: torch.Tensor) -> None:
    n = slots.numel()
    latent = pool.layout.mla_latent
    layers: list[Any] = list(cache.layers)
    for layer, entry in enumerate(layers):
        k = entry.keys[0, :, -n:].permute(1, 0, 2)  # [n, H, D]
        v = entry.values[0, :, -n:].permute(1, 0, 2)
        if latent:
            pool.keys[layer].index_copy_(0, slots, torch.cat([k, v], dim=-1).to(pool.dtype))
        else:
            assert pool.values is not None
            pool.keys[layer].index_copy_(0, slots, k.to(pool.dtype))
            pool.values[layer].index_copy_(0, slots, v.to(pool.dtype))


@torch.no_grad()
def forward_with_slots(
    model: Any,
    pool: SlotPool,
    context: torch.Tensor,
    tokens: list[int],
    positions: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Run ``tokens`` at ``positions`` attending to ``context`` slots; store their KV in ``slots``.

    Returns the logits of every new token, ``[len(tokens), vocab]`` (fp32).
    """
    cache = _build_cache(model, pool, context)
    ids = torch.tensor([tokens], dtype=torch.long, device=pool.keys.device)
    out = model(input_ids=ids, position_ids=positions[None].to(ids.device), cache=cache, use_cache=True)
    _store_new(pool, out.cache, slots)
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
