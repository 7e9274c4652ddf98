"""bench_fidelity's measures and tables: rates with Wilson intervals, means with normal intervals.

Every figure is over cases (one answer per case and question): a rate prints as ``83% (76–89)``,
its 95 % Wilson score interval in brackets; a mean (KL, logit cosine) as ``0.012 ± 0.004``, the
half-width of its 95 % normal interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np
from fidelity_arms import Answer
from fidelity_cases import Case
from notes_cases import mentions

__all__ = ["wilson", "rate", "mean_ci", "kl", "cosine", "pair_cells", "pair_row", "pull_row", "share", "right", "old"]

Check = Callable[[Case, str], bool]

Z = 1.96


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``k`` successes in ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(hits: Sequence[bool]) -> str:
    """``83% (76–89)``: the share of ``hits`` and its Wilson interval."""
    k, n = sum(hits), len(hits)
    lo, hi = wilson(k, n)
    return f"{k / n:.0%} ({lo * 100:.0f}–{hi * 100:.0f})" if n else "–"


def mean_ci(values: Sequence[float], digits: int = 4) -> str:
    """``0.0120 ± 0.0040``: the mean and its 95 % half-width."""
    if not values:
        return "–"
    half = Z * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {half:.{digits}f}"


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - math.log(float(np.exp(shifted).sum()))


def kl(reference: np.ndarray, other: np.ndarray) -> float:
    """KL(reference ‖ other) of the two next-token distributions."""
    p, q = _log_softmax(reference), _log_softmax(other)
    return float((np.exp(p) * (p - q)).sum())


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two logit vectors."""
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def probability(logits: np.ndarray, token: int) -> float:
    """The probability ``logits`` give ``token``."""
    return float(np.exp(_log_softmax(logits)[token]))


def in_top(logits: np.ndarray, token: int, k: int) -> bool:
    """Whether ``token`` is among the ``k`` most likely under ``logits``."""
    return bool((logits > logits[token]).sum() < k)


def pull_row(label: str, pairs: Sequence[tuple[Answer, int]]) -> str:
    """A markdown row: the probability each answer's first-token distribution gives a token (the
    removed secret's first token), and how often that token is among its 5 most likely."""
    probs = mean_ci([probability(a.logits, t) for a, t in pairs], 3)
    top = rate([in_top(a.logits, t, 5) for a, t in pairs])
    return f"| {label} | {probs} | {top} |"


def pair_cells(pairs: Sequence[tuple[Answer, Answer]]) -> list[str]:
    """First-token and greedy agreement, KL(ref ‖ arm), logit cosine; each pair is (arm, reference)."""
    return [
        rate([a.tokens[:1] == b.tokens[:1] for a, b in pairs]),
        rate([a.tokens == b.tokens for a, b in pairs]),
        mean_ci([kl(b.logits, a.logits) for a, b in pairs]),
        mean_ci([cosine(a.logits, b.logits) for a, b in pairs]),
    ]


def pair_row(label: str, pairs: Sequence[tuple[Answer, Answer]]) -> str:
    """A markdown row of :func:`pair_cells`."""
    return "| " + " | ".join([label, *pair_cells(pairs)]) + " |"


def share(answers: Sequence[tuple[Case, Answer]], check: Check) -> str:
    """The share of (case, answer) pairs whose answer passes ``check``, with its interval."""
    return rate([check(c, a.text) for c, a in answers])


def right(case: Case, text: str) -> bool:
    """The answer holds the case's right value."""
    return mentions(text, case.right)


def old(case: Case, text: str) -> bool:
    """The answer holds the removed (evicted, outdated or secret) value."""
    return mentions(text, case.old)
