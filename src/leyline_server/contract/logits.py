"""Logits processors: per-request changes to a logits row before sampling, shared by the engines
that sample in this process (embedded, llama.cpp).

A processor sees each row before the sampler does (``apply``, in place, masked tokens set to
``-inf``), then the token the sampler picked (``accept``). ``finished`` tells the decode loop to
stop (a grammar that reached its end). Rows are float tensors ``[vocab]``; a NumPy row (llama.cpp's
logits buffer) is wrapped without a copy by :func:`as_tensor`, so masking it changes the buffer
llama.cpp samples from.

Processors live inside one decode generator: the tokens they accept are exactly the tokens that
generator sampled, in order, including any decoded ahead of the consumer (``engines.threaded``).
The generator, and its processors, end with the turn; the next turn builds fresh ones, so what
was decoded ahead and never delivered cannot leak into a later turn's constraint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["LogitsProcessor", "Processors", "SuppressUntil", "as_tensor"]


def as_tensor(row: Any) -> torch.Tensor:
    """A torch view of ``row`` (a tensor is returned as is; a NumPy array shares its memory)."""
    if isinstance(row, np.ndarray):
        return torch.from_numpy(row)
    assert isinstance(row, torch.Tensor)
    return row


class LogitsProcessor(Protocol):
    """One request's change to the logits before sampling (see the module docstring)."""

    def apply(self, logits: torch.Tensor) -> None:
        """Change ``logits`` (``[vocab]``, float) in place before the next token is sampled."""
        ...

    def accept(self, token: int) -> None:
        """Record the token that was sampled."""
        ...

    @property
    def finished(self) -> bool:
        """Whether generation must stop after the last accepted token."""
        ...


class SuppressUntil:
    """Forbid ``tokens`` until ``count`` tokens were generated (SGLang's ``min_tokens``)."""

    def __init__(self, tokens: Iterable[int], count: int) -> None:
        self.tokens = torch.tensor(sorted(set(tokens)), dtype=torch.long)
        self.remaining = count

    def apply(self, logits: torch.Tensor) -> None:
        """Mask the stop tokens while generation is shorter than the minimum."""
        if self.remaining > 0 and self.tokens.numel():
            keep = self.tokens[self.tokens < logits.numel()]
            logits[keep] = float("-inf")

    def accept(self, token: int) -> None:
        """Count one more generated token."""
        self.remaining -= 1

    @property
    def finished(self) -> bool:
        """Never ends generation itself."""
        return False


class Processors:
    """Several processors applied in order, as one."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.items = list(processors)

    def __bool__(self) -> bool:
        return bool(self.items)

    def apply(self, logits: Any) -> None:
        """Apply every processor to ``logits`` (a tensor or a NumPy row), in place."""
        row = as_tensor(logits)
        for p in self.items:
            p.apply(row)

    def accept(self, token: int) -> None:
        """Tell every processor the sampled token."""
        for p in self.items:
            p.accept(token)

    @property
    def finished(self) -> bool:
        """Whether any processor ends generation."""
        return any(p.finished for p in self.items)
