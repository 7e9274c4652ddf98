"""Embedded engine core: slot pool + radix prefix cache + transformers forward (synchronous).

Everything here runs on one thread (``AsyncEngine`` in ``worker.py`` owns that thread). The
primitives are the ones the splice planner needs:

* ``match`` / ``commit`` — look a sequence up in the radix cache / insert it and pin it;
* ``extend`` — run new tokens at given positions after a context of slots, storing their KV in
  fresh slots (evicting unlocked cache if needed; ``CapacityError`` when even that is not enough);
* ``generate`` — prefill with prefix reuse, then greedy or sampled decoding, step by step.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, Field

from leyline_server.engines.embedded.cache_adapter import forward_with_slots, layer0_keys
from leyline_server.engines.embedded.pool import SlotPool
from leyline_server.engines.embedded.radix import Node, RadixCache
from leyline_server.rope import RopeSpec

__all__ = ["Engine", "SamplingParams", "CapacityError", "Pinned", "GenerationStep"]


class CapacityError(RuntimeError):
    """The pool cannot hold the tokens, even after evicting every unlocked cache entry."""


class SamplingParams(BaseModel):
    """Decoding parameters (OpenAI semantics: temperature 0 is greedy)."""

    max_tokens: int = Field(default=16, ge=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)


@dataclass
class Pinned:
    """A sequence whose first ``len(slots)`` tokens are cached on the locked radix path ``node``."""

    tokens: list[int]
    slots: torch.Tensor
    node: Node


@dataclass
class GenerationStep:
    """One decoded token (``finish_reason`` set on the last step)."""

    token: int
    finish_reason: str | None = None


class Engine:
    """One model, one slot pool, one radix cache. Not thread-safe: use from one thread."""

    def __init__(
        self,
        model: Any,
        pool: SlotPool,
        spec: RopeSpec,
        eos_token_ids: list[int] | None = None,
        rotation_budget: int = 64,
    ) -> None:
        self.model = model
        self.pool = pool
        self.spec = spec
        self.radix = RadixCache()
        self.eos_token_ids = list(eos_token_ids or [])
        self.rotation_budget = rotation_budget
        self.vocab_size = int(model.config.vocab_size)
        self.in_flight: set[int] = set()

    # -- slots ----------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor:
        """``n`` fresh slots (evicting unlocked cache if needed); ``CapacityError`` if impossible."""
        if self.pool.available < n:
            self.pool.free(self.radix.evict(n - self.pool.available))
        slots = self.pool.alloc(n)
        if slots is None:
            raise CapacityError(f"need {n} KV slots, {self.pool.available} free of {self.pool.capacity}")
        self.in_flight.update(slots.tolist())
        return slots

    def release(self, slots: torch.Tensor) -> None:
        """Give back slots this engine handed out and that no node took."""
        self.in_flight.difference_update(slots.tolist())
        self.pool.free(slots)

    def extend(
        self, context: torch.Tensor, tokens: list[int], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV for ``tokens`` at ``positions`` after ``context``: (new slots, logits per token)."""
        slots = self.alloc(len(tokens))
        try:
            logits = forward_with_slots(self.model, self.pool, context, tokens, positions, slots)
        except BaseException:
            self.release(slots)
            raise
        return slots, logits

    # -- radix ----------------------------------------------------------------------------------
    def match(self, tokens: list[int]) -> Pinned:
        """The cached prefix of ``tokens``, locked."""
        m = self.radix.match_prefix(tokens)
        self.radix.lock(m.node)
        return Pinned(list(tokens), m.slots, m.node)

    def commit(self, tokens: list[int], slots: torch.Tensor, previous: Pinned | None = None) -> Pinned:
        """Insert ``tokens -> slots`` (slots now owned by the tree), lock it, unlock ``previous``."""
        result = self.radix.insert(tokens[: len(slots)], slots)
        self.in_flight.difference_update(slots.tolist())
        if result.duplicate_slots.numel():
            self.pool.free(result.duplicate_slots)
        self.radix.lock(result.node)
        if previous is not None:
            self.radix.unlock(previous.node)
        path = self.radix.path_slots(result.node)
        return Pinned(list(tokens), path, result.node)

    def unpin(self, pinned: Pinned) -> None:
        """Release a ``Pinned`` (its path becomes evictable)."""
        self.radix.unlock(pinned.node)

    def layer0_keys(self, tokens: list[int], positions: torch.Tensor) -> torch.Tensor:
        """The model's own layer-0 cache rows for ``tokens`` at ``positions`` (the splice canary)."""
        return layer0_keys(self.model, tokens, positions, self.pool.layout.mla_latent)

    def check_integrity(self) -> None:
        """Every slot free, owned by one node, or in flight — exactly once (tests call this)."""
        self.radix.check_integrity(self.pool.capacity, self.pool.free_slots(), self.in_flight)

    # -- prefill and decode ---------------------------------------------------------------------
    def prefill(self, tokens: list[int], previous: Pinned | None = None) -> tuple[Pinned, torch.Tensor, int]:
        """Cache ``tokens`` reusing the longest cached prefix: (pinned, last logits, reused count).

        At least the last token is computed, so its logits are fresh.
        """
        if not tokens:
            raise ValueError("cannot prefill an empty sequence")
        hit = self.match(tokens[:-1])
        try:
            reused = len(hit.slots)
            rest = tokens[reused:]
            positions = torch.arange(reused, len(tokens))
            new_slots, logits = self.extend(hit.slots, rest, positions)
            pinned = self.commit(tokens, torch.cat([hit.slots, new_slots]))
        finally:
            self.unpin(hit)
        if previous is not None:
            self.unpin(previous)
        return pinned, logits[-1], reused

    def _sample(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
        if params.temperature < 1e-4:  # (near-)zero temperature is greedy; dividing would overflow
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.double() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    def decode(
        self, pinned: Pinned, logits: torch.Tensor, params: SamplingParams
    ) -> Generator[GenerationStep, None, None]:
        """Yield decoded tokens after ``pinned`` (whose last logits are ``logits``).

        On exhaustion the generated tokens are committed to the cache (all but the last, which
        has no KV yet) and ``pinned`` is updated in place; closing the iterator early (a
        cancelled request) commits what was generated so far.
        """
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        context = pinned.slots
        generated: list[int] = []
        fresh: list[torch.Tensor] = []
        stops = set(params.stop_token_ids) | set(self.eos_token_ids)
        try:
            for step in range(params.max_tokens):
                token = self._sample(logits, params, generator)
                generated.append(token)
                last = step == params.max_tokens - 1
                if token in stops:
                    yield GenerationStep(token, "stop")
                    return
                if last:
                    yield GenerationStep(token, "length")
                    return
                yield GenerationStep(token)
                pos = torch.tensor([len(pinned.tokens) + len(generated) - 1])
                slots, step_logits = self.extend(torch.cat([context, *fresh]), [token], pos)
                fresh.append(slots)
                logits = step_logits[-1]
        finally:
            tokens = pinned.tokens + generated
            slots = torch.cat([context, *fresh]) if fresh else context
            new = self.commit(tokens, slots, previous=pinned)
            pinned.tokens, pinned.slots, pinned.node = new.tokens, new.slots, new.node
