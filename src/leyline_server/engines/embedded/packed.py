"""Several sequences in one transformers forward: packed tokens, attention per sequence.

Layout of one packed forward over sequences ``s = 0..S-1``, each with ``ctx_s`` tokens already
cached (its mirror) and ``n_s`` new ones::

    input_ids     [ s0: n_0 new | s1: n_1 new | ... ]          one row, N = sum n_s tokens
    position_ids  [ ctx_0 .. ctx_0+n_0-1 | ctx_1 .. | ... ]    each sequence's own positions
    mirror_s      [ 0 .. ctx_s-1 cached | ctx_s .. ctx_s+n_s-1 new ]   per layer, contiguous

Projections, norms and MLPs see one ``[1, N]`` batch. Each layer's cache update writes every
sequence's new rows into its mirror and its pool slots; attention (:func:`packed_attention`,
registered with transformers as ``"leyline_packed"``) then runs once per sequence: its queries
over its own mirror ``[0, ctx_s + n_s)``, through the model's original attention function with the
mask transformers builds for one sequence (none for one query or a fresh causal prefill, else a
causal mask offset by ``ctx_s``; windowed for sliding-window layers). Nothing is padded and no
sequence's keys are copied, except for MLA models, whose attention up-projects the cached latent
after the update (the update then returns every sequence's latent concatenated, which the model
up-projects in one go, and attention splits it again).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from leyline_server.engines.embedded.cache_adapter import forward_with_slots
from leyline_server.engines.embedded.mirror import Mirror, MirrorStore
from leyline_server.engines.embedded.pool import SlotPool

__all__ = ["Segment", "forward_packed", "packed_attention", "PACKED"]

PACKED = "leyline_packed"


class Segment(NamedTuple):
    """One sequence's part of a packed forward: ``tokens`` at positions ``len(context)..`` after the
    ``context`` slots, stored into ``slots``; ``want_logits``: return its last token's logits."""

    context: torch.Tensor
    tokens: Sequence[int]
    slots: torch.Tensor
    want_logits: bool


@dataclass
class _Plan:
    """What attention needs to split a packed forward: per sequence (query offset, new, cached)."""

    queries: list[tuple[int, int, int]]
    concat: bool  # MLA: the update returned the sequences' caches concatenated
    base: Any  # the model's own attention function (None: its module's eager one)
    eager: bool  # the base wants an additive float mask (eager) rather than a boolean one (sdpa)
    views: dict[int, list[tuple[torch.Tensor, torch.Tensor]]]  # layer -> per sequence (K, V) views


class _PackedLayer(CacheLayerMixin):
    """One layer's cache for a packed forward: writes each sequence's new rows to its mirror and the pool."""

    is_sliding = False
    is_croppable = False

    def __init__(self, layer: int, mirrors: list[Mirror], plan: _Plan, pool: SlotPool, slots: torch.Tensor) -> None:
        super().__init__()
        self.layer, self.mirrors, self.plan, self.pool, self.slots = layer, mirrors, plan, pool, slots
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the mirrors exist before the forward."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``[1, H, N, D]`` packed states; return what attention reads (see the module docstring)."""
        k_rows, v_rows = key_states[0].transpose(0, 1), value_states[0].transpose(0, 1)  # [N, H, D]
        pool, i = self.pool, self.layer
        if pool.layout.mla_latent:
            pool.keys[i].index_copy_(0, self.slots, torch.cat([k_rows, v_rows], dim=-1).to(pool.dtype))
        else:
            assert pool.values is not None
            pool.keys[i].index_copy_(0, self.slots, k_rows.to(pool.dtype))
            pool.values[i].index_copy_(0, self.slots, v_rows.to(pool.dtype))
        views = []
        for mirror, (q0, n, ctx) in zip(self.mirrors, self.plan.queries, strict=True):
            mirror.keys[i, :, ctx : ctx + n].copy_(key_states[0, :, q0 : q0 + n])
            mirror.values[i, :, ctx : ctx + n].copy_(value_states[0, :, q0 : q0 + n])
            views.append((mirror.keys[i, None, :, : ctx + n], mirror.values[i, None, :, : ctx + n]))
        self.plan.views[i] = views
        if self.plan.concat:
            return torch.cat([k for k, _ in views], dim=2), torch.cat([v for _, v in views], dim=2)
        return key_states, value_states  # unused: attention reads the views

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """No mask is built for a packed forward (attention makes each sequence's own)."""
        return query_length, 0

    def get_seq_length(self) -> int:
        """Not one length: the sequences' caches differ (only masks would ask)."""
        return 0

    def get_max_length(self) -> int:
        """No fixed maximum."""
        return -1


class _PackedCache(Cache):
    def __init__(self, mirrors: list[Mirror], plan: _Plan, pool: SlotPool, slots: torch.Tensor) -> None:
        slots = slots.to(torch.int64).to(pool.keys.device)
        super().__init__(layers=[_PackedLayer(i, mirrors, plan, pool, slots) for i in range(pool.layout.layers)])


def _mask(n: int, ctx: int, window: int | None, eager: bool, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask transformers gives one sequence of ``n`` queries after ``ctx`` cached tokens."""
    length = ctx + n
    windowed = window is not None and length > window
    if not windowed and (n == 1 or (ctx == 0 and not eager)):
        return None  # one query sees everything; a fresh prefill is sdpa's own is_causal
    q = torch.arange(ctx, length)[:, None]
    k = torch.arange(length)[None, :]
    allowed = k <= q
    if windowed:
        allowed &= k > q - int(window)  # type: ignore[arg-type]
    if eager:
        return torch.zeros(1, 1, n, length, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed[None, None]


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed forward: each sequence's queries over its own keys (module docstring)."""
    plan: _Plan = kwargs.pop("leyline_packed")
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    window = getattr(module, "sliding_window", None)
    # eager: the model's own module's function (softcapping, sinks and the like live there)
    base = plan.base or sys.modules[type(module).__module__].eager_attention_forward
    outputs, kv_at = [], 0
    for s, (q0, n, ctx) in enumerate(plan.queries):
        q = query[:, :, q0 : q0 + n]
        if plan.concat:
            k, v = key[:, :, kv_at : kv_at + ctx + n], value[:, :, kv_at : kv_at + ctx + n]
            kv_at += ctx + n
        else:
            k, v = plan.views[layer][s]
        mask = _mask(n, ctx, window, plan.eager, q.dtype)
        out, _ = base(module, q, k, v, mask, scaling=scaling, dropout=dropout, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(PACKED, packed_attention)


@contextmanager
def _packed_attention(model: Any) -> Any:
    """Route the model's attention through :func:`packed_attention` for one forward; yields the base."""
    config = model.config
    original = config._attn_implementation
    base = ALL_ATTENTION_FUNCTIONS[original] if original != "eager" else None
    config._attn_implementation = PACKED
    try:
        yield (None if original == "eager" else base), original == "eager"
    finally:
        config._attn_implementation = original


@torch.no_grad()
def forward_packed(model: Any, pool: SlotPool, mirrors: MirrorStore, segments: Sequence[Segment]) -> list[Any]:
    """Run every segment in one forward; each segment's last-token logits ``[vocab]`` fp32 where it
    wants them (else ``None``). One segment takes the plain path (:func:`forward_with_slots`)."""
    if len(segments) == 1:
        seg = segments[0]
        positions = torch.arange(seg.context.numel(), seg.context.numel() + len(seg.tokens))
        logits = forward_with_slots(model, pool, mirrors, seg.context, list(seg.tokens), positions, seg.slots)
        return [logits[-1] if seg.want_logits else None]
    held: list[Mirror] = []
    for seg in segments:
        held.append(mirrors.acquire(seg.context, len(seg.tokens), keep=held))
    queries, at = [], 0
    for seg, mirror in zip(segments, held, strict=True):
        queries.append((at, len(seg.tokens), mirror.length))
        at += len(seg.tokens)
    device = pool.keys.device
    ids = torch.tensor([[t for seg in segments for t in seg.tokens]], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(ctx, ctx + n) for _, n, ctx in queries])[None].to(device)
    keep = torch.tensor([q0 + n - 1 for (q0, n, _), seg in zip(queries, segments, strict=True) if seg.want_logits])
    slots = torch.cat([seg.slots for seg in segments])
    with _packed_attention(model) as (base, eager):
        plan = _Plan(queries, bool(pool.layout.mla_latent), base, eager, {})
        cache = _PackedCache(held, plan, pool, slots)
        out = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True,
                    logits_to_keep=keep if keep.numel() else 1, leyline_packed=plan)  # fmt: skip
    for seg, mirror, (_, _, ctx) in zip(segments, held, queries, strict=True):
        mirror.commit(seg.slots, pool.generation, ctx)
    rows = iter(out.logits[0].float()) if keep.numel() else iter(())
    return [next(rows) if seg.want_logits else None for seg in segments]
