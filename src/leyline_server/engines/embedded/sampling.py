"""Token sampling over one logits row: OpenAI's temperature, top_p, penalties, logit_bias, logprobs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from leyline_server.engines.base import GenerationStep, SamplingParams, TokenLogprob

__all__ = ["Sampler"]

GREEDY_BELOW = 1e-4  # (near-)zero temperature is greedy; dividing by it would overflow


class Sampler:
    """Picks tokens for one request; deterministic for a seed."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.counts: Counter[int] = Counter()

    def _adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if not (p.logit_bias or p.presence_penalty or p.frequency_penalty):
            return logits
        out = logits.clone()
        for token, bias in p.logit_bias.items():
            if 0 <= token < out.numel():
                out[token] += bias
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(list(self.counts), dtype=torch.long)
            freq = torch.tensor([self.counts[t] for t in self.counts.keys()], dtype=out.dtype)
            out[ids] -= p.frequency_penalty * freq + p.presence_penalty
        return out

    def _pick(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.temperature < GREEDY_BELOW:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.double() / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < p.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def step(self, logits: torch.Tensor, finish_reason: str | None = None) -> GenerationStep:
        """Sample the next token from ``logits`` (fp32, ``[vocab]``) and describe it."""
        token = self._pick(self._adjusted(logits))
        self.counts[token] += 1
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

    @staticmethod
    def stops(params: SamplingParams, eos: Sequence[int]) -> set[int]:
        """Token ids that end generation."""
        return set(params.stop_token_ids) | set(eos)
