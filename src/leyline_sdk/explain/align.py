"""Bounded token alignment: which runs of two long token sequences are the same tokens.

:func:`matching_blocks` aligns a session's base with a new render of its conversation (100k
tokens and more) in time linear in their length plus the size of what changed:

1. the common prefix and (optionally) suffix are skipped by slice comparison;
2. the rest of each side is cut into *content-defined chunks*: a chunk ends after position ``i``
   when a hash of the token pair ``(t[i-1], t[i])`` falls below a threshold (one in
   ``avg_chunk`` pairs). The cut points depend only on the neighbouring tokens, so an edit
   disturbs the chunks it touches and no others, wherever it shifts the rest;
3. the chunks are matched as whole units (``difflib`` over ~n/32 hashable keys);
4. between matched chunk runs the tokens are aligned by ``difflib`` where both sides are small
   enough (``max_gap_cells``: the product of the two lengths), else chunked again, finer (down
   to 4 tokens on average); what is still too big is matched only by its common prefix and
   suffix, the rest stays unmatched (a caller then replaces it as a whole).

Nothing here decides what an edit means; :mod:`leyline_sdk.explain.templates` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import NamedTuple

from leyline_sdk.explain.diff import _common_prefix, _common_suffix

__all__ = ["AlignLimits", "Block", "matching_blocks"]

_MIX_A = 0x9E3779B1
_MIX_B = 0x85EBCA77


class Block(NamedTuple):
    """``a[a : a + size] == b[b : b + size]``."""

    a: int
    b: int
    size: int


@dataclass(frozen=True)
class AlignLimits:
    """Cost bounds of the alignment (defaults suit conversations of 100k+ tokens).

    ``avg_chunk``: mean chunk length in tokens (a power of two); ``direct``: sides this short are
    aligned token by token without chunking; ``max_gap_cells``: the largest ``len(a) * len(b)``
    handed to ``difflib`` in one gap.
    """

    avg_chunk: int = 32
    direct: int = 512
    max_gap_cells: int = 4_000_000


DEFAULT_LIMITS = AlignLimits()


def matching_blocks(
    a: Sequence[int], b: Sequence[int], suffix: bool = True, limits: AlignLimits = DEFAULT_LIMITS
) -> list[Block]:
    """Sorted, non-overlapping matching runs of ``a`` and ``b`` (adjacent runs coalesced).

    ``suffix=False`` skips the common-suffix shortcut (for a base that should match a *prefix*
    of ``b``, where the two ends are unrelated).
    """
    n, m = len(a), len(b)
    p = _common_prefix(a, 0, n, b, 0, m)
    s = _common_suffix(a, p, n, b, p, m) if suffix else 0
    blocks: list[Block] = [Block(0, 0, p)] if p else []
    blocks += _middle(a, p, n - s, b, p, m - s, limits)
    if s:
        blocks.append(Block(n - s, m - s, s))
    return _coalesce(blocks)


def _coalesce(blocks: list[Block]) -> list[Block]:
    out: list[Block] = []
    for blk in blocks:
        if blk.size <= 0:
            continue
        if out and out[-1].a + out[-1].size == blk.a and out[-1].b + out[-1].size == blk.b:
            last = out.pop()
            blk = Block(last.a, last.b, last.size + blk.size)
        out.append(blk)
    return out


def _cuts(seq: Sequence[int], lo: int, hi: int, avg_chunk: int) -> list[int]:
    """Chunk bounds ``[lo, …, hi]`` of ``seq[lo:hi]``, content-defined (see the module docstring)."""
    threshold = (1 << 32) // max(avg_chunk, 1)
    part = seq[lo:hi]
    inner = [
        lo + i
        for i, (x, y) in enumerate(zip(part, part[1:], strict=False), 1)
        if (((x * _MIX_A) ^ y) * _MIX_B) & 0xFFFFFFFF < threshold
    ]
    return [lo, *inner, hi]


def _middle(a: Sequence[int], a0: int, a1: int, b: Sequence[int], b0: int, b1: int, limits: AlignLimits) -> list[Block]:
    """Matching blocks of ``a[a0:a1]`` and ``b[b0:b1]``: chunks first, then tokens in the gaps."""
    if a0 >= a1 or b0 >= b1:
        return []
    if max(a1 - a0, b1 - b0) <= limits.direct:
        return _gap(a, a0, a1, b, b0, b1, limits)
    ca, cb = _cuts(a, a0, a1, limits.avg_chunk), _cuts(b, b0, b1, limits.avg_chunk)
    ka = [tuple(a[x:y]) for x, y in zip(ca, ca[1:], strict=False)]
    kb = [tuple(b[x:y]) for x, y in zip(cb, cb[1:], strict=False)]
    out: list[Block] = []
    pa, pb = a0, b0  # end of the previous matched chunk run, in tokens
    for i, j, size in SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks():
        ta, tb = ca[i], cb[j]
        out += _gap(a, pa, ta, b, pb, tb, limits)
        if size:
            length = ca[i + size] - ta
            out.append(Block(ta, tb, length))
            pa, pb = ta + length, tb + length
    return out


def _gap(a: Sequence[int], a0: int, a1: int, b: Sequence[int], b0: int, b1: int, limits: AlignLimits) -> list[Block]:
    """Token-level matching blocks in a gap; past ``max_gap_cells`` only its common ends."""
    if a0 >= a1 or b0 >= b1:
        return []
    p = _common_prefix(a, a0, a1, b, b0, b1)
    s = _common_suffix(a, a0 + p, a1, b, b0 + p, b1)
    out = [Block(a0, b0, p)] if p else []
    x0, x1, y0, y1 = a0 + p, a1 - s, b0 + p, b1 - s
    if x0 < x1 and y0 < y1:
        if (x1 - x0) * (y1 - y0) <= limits.max_gap_cells:
            matcher = SequenceMatcher(None, a[x0:x1], b[y0:y1], autojunk=False)
            out += [Block(x0 + i, y0 + j, size) for i, j, size in matcher.get_matching_blocks() if size]
        elif limits.avg_chunk > 4:  # too big for difflib: finer chunks
            finer = AlignLimits(limits.avg_chunk // 4, 0, limits.max_gap_cells)
            out += _middle(a, x0, x1, b, y0, y1, finer)
    if s:
        out.append(Block(a1 - s, b1 - s, s))
    return out
