"""The model's own layer-0 keys inside an SGLang scheduler: what the canary compares rotated rows with.

Layer-0 keys depend only on the token and its position, so the keys a fresh prefill would cache
for token ``t`` at position ``p`` can be computed alone, with SGLang's own modules of layer 0:
the embedding, the layer's input norm, then

* MHA/GQA models (Llama, Qwen, Mistral, ...): the attention module's own forward, stopped where it
  hands ``k`` to its ``RadixAttention`` (a forward pre-hook reads ``k`` and ends the forward), so
  the projection, any q/k norm and the rotary embedding are the model's code, whatever the family;
* MLA models (DeepSeek-V2/V3): the latent projection, its norm and the rotary embedding of
  ``k_pe``, assembled as SGLang's MLA pool stores a row, ``[latent | k_pe]``.

The result has the pool's row shape (``[n, kv_heads, head_dim]`` or ``[n, 1, rank + rope]``).
A model laid out otherwise has no key function (the canary is then reported unavailable); a
family whose layer 0 computes keys differently makes the canary fail, which falls back to
``forget`` (safe) rather than splicing.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["KeyFunction", "layer0_key_function"]

KeyFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Captured(Exception):
    """Ends the attention forward once ``k`` has been read."""


def _extend_batch() -> Any:
    """The little of a ``ForwardBatch`` an attention forward reads before its attention call."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(forward_mode=ForwardMode.EXTEND)


def _hidden(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    inner = model.model
    return inner.layers[0].input_layernorm(inner.embed_tokens(tokens))


def _mha_keys(model: Any, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    attn = model.model.layers[0].self_attn
    radix = attn.attn
    seen: list[torch.Tensor] = []

    def capture(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append(kwargs["k"] if "k" in kwargs else args[1])
        raise _Captured

    hook = radix.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        attn(positions=positions, hidden_states=_hidden(model, tokens), forward_batch=_extend_batch())
    except _Captured:
        pass
    finally:
        hook.remove()
    if not seen:
        raise RuntimeError("layer 0's attention never called its RadixAttention")
    return seen[0].reshape(tokens.numel(), int(radix.tp_k_head_num), int(radix.qk_head_dim))


def _mla_keys(model: Any, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    attn = model.model.layers[0].self_attn
    hidden = _hidden(model, tokens)
    rank = int(attn.kv_lora_rank)
    if getattr(attn, "q_lora_rank", None) is not None and hasattr(attn, "fused_qkv_a_proj_with_mqa"):
        latent = attn.fused_qkv_a_proj_with_mqa(hidden)[0][..., int(attn.q_lora_rank) :]
    else:
        latent = attn.kv_a_proj_with_mqa(hidden)[0]
    k_nope = attn.kv_a_layernorm(latent[..., :rank].contiguous()).unsqueeze(1)
    k_pe = latent[..., rank:].unsqueeze(1)
    _, k_pe = attn.rotary_emb(positions, k_pe.clone(), k_pe.contiguous())
    return torch.cat([k_nope, k_pe.reshape(k_nope.shape[0], 1, -1)], dim=-1)


def layer0_key_function(model: Any, kind: str) -> KeyFunction | None:
    """``keys(tokens, positions)`` of layer 0 for ``model`` (``kind``: the pool's "mha" or "mla"),
    or ``None`` when the model is not laid out as described in the module docstring."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or not layers or not hasattr(inner, "embed_tokens"):
        return None
    layer = layers[0]
    attn = getattr(layer, "self_attn", None)
    if attn is None or not hasattr(layer, "input_layernorm"):
        return None
    if kind == "mla":
        if not all(hasattr(attn, name) for name in ("kv_lora_rank", "kv_a_layernorm", "rotary_emb")):
            return None
        fn = _mla_keys
    else:
        if not isinstance(getattr(attn, "attn", None), torch.nn.Module):
            return None
        fn = _mha_keys

    @torch.no_grad()
    def keys(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return fn(model, tokens, positions)

    return keys
