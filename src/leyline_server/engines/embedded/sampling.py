"""Token sampling over one logits row: OpenAI's temperature, top_p, penalties, logit_bias, logprobs,
and SGLang's top_k, min_p and repetition_penalty.

Order (as SGLang's sampler): logits processors (constraints, ``min_tokens``), logit_bias,
repetition/frequency/presence penalties, then greedy (temperature ~0) or temperature, top-k,
top-p, min-p and a seeded draw. Logprobs are the model's own (before all of it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from leyline_server.contract.logits import Processors
from leyline_server.contract.values import GenerationStep, SamplingParams, TokenLogprob

__all__ = ["Sampler"]

GREEDY_BELOW = 1e-4  # (near-)zero temperature is greedy; dividing by it would overflow


class Sampler:
    """Picks tokens for one request; deterministic for a seed."""

    def __init__(self, params: SamplingParams, processors: Processors | None = None) -> None:
        self.params = params
        self.processors = processors
        self.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.counts: Counter[int] = Counter()

    def _adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        repeat = p.repetition_penalty != 1.0
        if not (self.processors or p.logit_bias or p.presence_penalty or p.frequency_penalty or repeat):
            return logits
        out = logits.clone()
        if self.processors:
            self.processors.apply(out)
        for token, bias in p.logit_bias.items():
            if 0 <= token < out.numel():
                out[token] += bias
        if self.counts and (p.presence_penalty or p.frequency_penalty or repeat):
            ids = torch.tensor(list(self.counts), dtype=torch.long)
            if repeat:  # SGLang's: divide positive logits, multiply negative ones
                seen = out[ids]
                out[ids] = torch.where(seen < 0, seen * p.repetition_penalty, seen / p.repetition_penalty)
            freq = torch.tensor([self.counts[t] for t in self.counts.keys()], dtype=out.dtype)
            out[ids] -= p.frequency_penalty * freq + p.presence_penalty
        return out

    def _pick(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.temperature < GREEDY_BELOW or p.top_k == 1:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.double() / p.temperature, dim=-1)
        if 0 < p.top_k < probs.numel():
            cut = torch.topk(probs, p.top_k).values[-1]
            probs = torch.where(probs >= cut, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < p.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        if p.min_p > 0.0:
            probs = torch.where(probs >= p.min_p * probs.max(), probs, torch.zeros_like(probs))
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def step(self, logits: torch.Tensor, finish_reason: str | None = None) -> GenerationStep:
        """Sample the next token from ``logits`` (fp32, ``[vocab]``) and describe it."""
        token = self._pick(self._adjusted(logits))
        self.counts[token] += 1
        if self.processors:
            self.processors.accept(token)
        step = GenerationStep(token, finish_reason)
        if self.params.logprobs:
            logp = torch.log_softmax(logits.double(), dim=-1)
            step.logprob = float(logp[token])
            if self.params.top_logprobs:
                top = torch.topk(logp, self.params.top_logprobs)
                step.top_logprobs = [
                    TokenLogprob(int(t), float(v))
                    for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ]
        return step

    @property
    def finished(self) -> bool:
        """Whether a processor (a complete grammar) ends generation after the last token."""
        return bool(self.processors) and self.processors.finished  # type: ignore[union-attr]

    @staticmethod
    def stops(params: SamplingParams, eos: Sequence[int]) -> set[int]:
        """Token ids that end generation (the model's EOS ones unless ``ignore_eos``)."""
        return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
