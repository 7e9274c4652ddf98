"""The embedded engine as ``bench_notes`` drives it: a chat renderer, timed prefills and splices, greedy answers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from notes_cases import TOOLS

from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_server.contract.values import CacheScope, Handle, Prefilled, SamplingParams, SpliceRequest
from leyline_server.splice import splice


@dataclass
class Outcome:
    """One arm's answer and what producing its first token took after the edit."""

    text: str
    first: int
    logits: torch.Tensor
    ttft_ms: float
    computed: int


class Bench:
    """The embedded engine with a chat renderer, timed prefills and splices, greedy answers."""

    def __init__(self, engine: Any, tokenizer: Any, answer_tokens: int) -> None:
        """Wrap ``engine``; answers are ``answer_tokens`` greedy tokens."""
        self.engine, self.tokenizer, self.answer_tokens = engine, tokenizer, answer_tokens
        self.chat = HFChatTokenizer(tokenizer)

    def render(self, messages: list[dict[str, Any]], generate: bool = True) -> list[int]:
        """Token ids of ``messages`` under SmolLM2's template (tool calls in the text form)."""
        return list(self.chat.render(messages, tools=TOOLS, add_generation_prompt=generate).tokens)

    def ask(self, messages: list[dict[str, Any]], prefix: str) -> list[int]:
        """``messages`` with the generation prompt, then the answer's forced ``prefix`` (the value comes next)."""
        return self.render(messages) + list(self.tokenizer(prefix, add_special_tokens=False)["input_ids"])

    def reset(self) -> None:
        """Empty the prefix cache and the mirrors (nothing may be locked)."""
        self.engine.pool.free(self.engine.radix.evict(self.engine.pool.capacity))
        self.engine.mirrors.clear()

    def trim(self) -> None:
        """Drop every unlocked cached path (what the previous arm left), keep the mirrors."""
        self.engine.pool.free(self.engine.radix.evict(self.engine.pool.capacity))

    def prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled:
        """``engine.prefill``."""
        return self.engine.prefill(list(tokens), scope, previous=previous)

    def answer(self, result: Prefilled, ttft_ms: float, computed: int) -> Outcome:
        """Greedy-decode after ``result``, release its handle."""
        steps = list(
            self.engine.decode(result.handle, result.last_logits, SamplingParams(max_tokens=self.answer_tokens))
        )
        self.engine.release(result.handle)
        tokens = [s.token for s in steps]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Outcome(text.strip(), tokens[0], result.last_logits.double(), ttft_ms, computed)

    def timed_prefill(self, tokens: Sequence[int], scope: CacheScope) -> Outcome:
        """Prefill (reusing what ``scope`` matches) and answer; the prefill is the time to first token."""
        started = time.perf_counter()
        result = self.prefill(tokens, scope)
        ms = (time.perf_counter() - started) * 1e3
        return self.answer(result, ms, len(tokens) - result.reused)

    def timed_splice(
        self,
        base: Sequence[int],
        request: SpliceRequest,
        prompt: Sequence[int],
        scope: CacheScope,
    ) -> Outcome:
        """Open ``base`` (cached) in ``scope``, splice, prefill ``prompt``; time splice + prefill."""
        handle = self.prefill(base, scope).handle
        started = time.perf_counter()
        handle, report = splice(self.engine, handle, request)
        if not report.applied or report.fallback is not None:
            raise AssertionError(f"splice fell back: {report}")
        result = self.prefill(prompt, scope, previous=handle)
        ms = (time.perf_counter() - started) * 1e3
        return self.answer(result, ms, report.prefilled_tokens + len(prompt) - result.reused)
