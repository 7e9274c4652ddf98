"""Templates edit too: a new render explained as directives on the session's base.

Reasoning models' chat templates drop the ``<think>`` block of earlier assistant turns once a new
user query arrives; others insert today's date or render a tool result differently once an
assistant turn follows it. The new render is then not an extension of the base (the previous
prompt plus the generated tokens), but the difference is still a handful of edits.
:func:`explain` aligns the base with the new render (:mod:`leyline_sdk.explain.align`, bounded on 100k+
tokens), cuts the difference into *hunks* and gives each a mode and a :class:`Source`:

* a hunk inside a message that a policy (or the agent, or a plain client) edited takes that
  edit's mode (``Region``);
* any other hunk is the template's. **Rule:** content the template *removed* — the new tokens
  are the old ones with one contiguous piece cut out (checked on the tokens, and on the decoded
  text where a decoder is given, which sees through re-tokenization at the cut) — is an
  ``amortize`` deletion: earlier reasoning, a generated answer re-rendered without its
  reasoning. Content the template *changed or inserted* (a date, a counter, a re-rendered tool
  result) is a changed fact: ``forget`` from there on.

Hunks of one edited message merge into one directive, and so do template hunks of one mode
fewer than ``MIN_GAP`` equal tokens apart (two close deletions: one amortize directive whose
replacement is the few tokens between them); the first ``forget`` becomes one directive
that drops the rest of the base (the server prefills the new render from there). The result is
verified: ``apply(base, D)`` equals the new render (or, ``prefix=True``, a prefix of it); anything
else falls back to one ``forget`` from the first differing token. Never a directive that does
not reproduce the new render.

The same difference seen twice helps tell the template's edits from the client's on a template
whose message spans are only approximate: :func:`explain_composed` aligns base → the new render
*without* the client's edits of earlier messages (all template), then that → the new render (all
client), and composes the two. :mod:`leyline_sdk.explain.turns` decides, per request, which to use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.explain.align import DEFAULT_LIMITS, AlignLimits, Block, matching_blocks
from leyline_sdk.explain.diff import common_prefix_length
from leyline_sdk.render.rendering import RenderedConversation

__all__ = [
    "Source",
    "Region",
    "Explanation",
    "Transcript",
    "explain",
    "explain_composed",
    "is_removal",
    "Label",
]

Decoder = Callable[[Sequence[int]], str]
MIN_GAP = 8  # template hunks of one mode closer than this many equal tokens become one directive
MAX_DIRECTIVES = 256  # the server's default limit: past it, the rest is one forget


class Source(str, Enum):
    """Who made an edit: the chat ``template``, a ``policy``, or the ``client`` (the agent itself)."""

    TEMPLATE = "template"
    POLICY = "policy"
    CLIENT = "client"


class Region(NamedTuple):
    """Base tokens ``[start, end)`` of a message someone edited, with that edit's mode."""

    start: int
    end: int
    mode: Mode
    source: Source


@dataclass(frozen=True)
class Hunk:
    """Base ``[a0, a1)`` became new ``[b0, b1)``; ``region`` is the edited region it lies in (-1: none)."""

    a0: int
    a1: int
    b0: int
    b1: int
    mode: Mode
    source: Source
    region: int = -1


@dataclass(frozen=True)
class Explanation:
    """Directives on the base, each one's :class:`Source`, and why it fell back (``None``: it did not)."""

    directives: list[Directive]
    sources: list[Source]
    fallback: str | None = None

    def count(self, source: Source) -> int:
        """How many directives came from ``source``."""
        return sum(s is source for s in self.sources)


@dataclass(frozen=True)
class Transcript:
    """What a request rendered: its messages, tools and rendering (the server keeps the last one)."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None
    render: RenderedConversation = field(compare=False)


def is_removal(old: Sequence[int], new: Sequence[int], decode: Decoder | None = None) -> bool:
    """Whether ``new`` is ``old`` with one contiguous piece cut out (tokens, else decoded text)."""
    if len(new) >= len(old):
        return False
    p = common_prefix_length(old, new)
    if p + common_prefix_length(old[::-1], new[::-1]) >= len(new):
        return True
    if decode is None:
        return False
    old_text, new_text = decode(old), decode(new)
    if len(new_text) >= len(old_text):
        return False
    p = len(os.path.commonprefix([old_text, new_text]))
    s = len(os.path.commonprefix([old_text[p:][::-1], new_text[p:][::-1]]))
    return p + s >= len(new_text)


def _raw_hunks(blocks: Sequence[Block], n: int, m: int, prefix: bool) -> list[tuple[int, int, int, int]]:
    """The unmatched stretches between matching blocks; ``prefix``: the base's unmatched end is dropped."""
    out = []
    pa = pb = 0
    for blk in blocks:
        if blk.a > pa or blk.b > pb:
            out.append((pa, blk.a, pb, blk.b))
        pa, pb = blk.a + blk.size, blk.b + blk.size
    if prefix and pa < n:
        out.append((pa, n, pb, pb))
    elif not prefix and (pa < n or pb < m):
        out.append((pa, n, pb, m))
    return out


def _region_of(regions: Sequence[Region], a0: int, a1: int) -> int:
    for k, r in enumerate(regions):
        if (r.start < a1 and a0 < r.end) if a0 < a1 else r.start <= a0 <= r.end:
            return k
    return -1


Label = tuple[Mode, Source] | Callable[[Sequence[int], Sequence[int]], tuple[Mode, Source]]


def _label(
    base: Sequence[int],
    new: Sequence[int],
    raw: Sequence[tuple[int, int, int, int]],
    regions: Sequence[Region],
    decode: Decoder | None,
    default: Label | None = None,
) -> list[Hunk]:
    """Each hunk's mode and source: its edited region's, else ``default`` (a label, or a function of
    the hunk's old and new tokens), else the template rule."""
    out = []
    for a0, a1, b0, b1 in raw:
        k = _region_of(regions, a0, a1)
        if k >= 0:
            out.append(Hunk(a0, a1, b0, b1, regions[k].mode, regions[k].source, k))
            continue
        if default is not None:
            mode, source = default(base[a0:a1], new[b0:b1]) if callable(default) else default
            out.append(Hunk(a0, a1, b0, b1, mode, source))
            continue
        mode = Mode.AMORTIZE if is_removal(base[a0:a1], new[b0:b1], decode) else Mode.FORGET
        out.append(Hunk(a0, a1, b0, b1, mode, Source.TEMPLATE))
    return out


def _merge(hunks: Sequence[Hunk]) -> list[Hunk]:
    """One hunk per edited region; close template hunks of one mode joined."""
    out: list[Hunk] = []
    for h in hunks:
        last = out[-1] if out else None
        same_region = last is not None and last.region >= 0 and last.region == h.region
        close = (
            last is not None
            and (last.source, last.mode, last.region) == (h.source, h.mode, h.region)
            and h.a0 - last.a1 < MIN_GAP
            and h.b0 - last.b1 < MIN_GAP
        )
        if last is not None and (same_region or close):
            mode = Mode.FORGET if Mode.FORGET in (last.mode, h.mode) else Mode.AMORTIZE
            out[-1] = Hunk(last.a0, h.a1, last.b0, h.b1, mode, last.source, last.region)
        else:
            out.append(h)
    return out


def _finish(base: Sequence[int], new: Sequence[int], hunks: Sequence[Hunk], prefix: bool) -> Explanation:
    """Directives from labelled hunks (first forget drops the rest), verified; else the fallback."""
    n = len(base)
    directives: list[Directive] = []
    sources: list[Source] = []
    merged = _merge(hunks)
    for i, h in enumerate(merged):
        if h.mode is Mode.FORGET or (len(directives) == MAX_DIRECTIVES - 1 and i < len(merged) - 1):
            rest = () if prefix else tuple(new[h.b0 :])
            directives.append(Directive.model_construct(start=h.a0, end=n, replacement=rest, mode=Mode.FORGET))
            sources.append(h.source)
            break
        directives.append(
            Directive.model_construct(start=h.a0, end=h.a1, replacement=tuple(new[h.b0 : h.b1]), mode=h.mode)
        )
        sources.append(h.source)
    result = apply(base, directives)
    if (list(new[: len(result)]) if prefix else list(new)) == result:
        return Explanation(directives, sources)
    return _fallback(base, new, prefix, "the alignment did not reproduce the new render")


def _fallback(base: Sequence[int], new: Sequence[int], prefix: bool, why: str) -> Explanation:
    """One forget from the first differing token (dropping the rest of the base, or replacing it)."""
    p = common_prefix_length(base, new)
    if p == len(base) and (prefix or p == len(new)):
        return Explanation([], [], why)
    rest = () if prefix else tuple(new[p:])
    return Explanation([Directive(start=p, end=len(base), replacement=rest, mode=Mode.FORGET)], [Source.TEMPLATE], why)


def explain(
    base: Sequence[int],
    new: Sequence[int],
    regions: Sequence[Region] = (),
    *,
    prefix: bool = True,
    decode: Decoder | None = None,
    default: Label | None = None,
    limits: AlignLimits = DEFAULT_LIMITS,
) -> Explanation:
    """Directives with ``apply(base, D) == new`` (``prefix=True``: a prefix of ``new``).

    ``regions`` (sorted) are base ranges of messages a policy or the client edited; every other
    difference is the template's (the rule in the module docstring), or ``default``'s where given
    (a caller that cannot tell who made it: a label, or a function of a hunk's old and new tokens).
    """
    blocks = matching_blocks(base, new, suffix=not prefix, limits=limits)
    raw = _raw_hunks(blocks, len(base), len(new), prefix)
    return _finish(base, new, _label(base, new, raw, regions, decode, default), prefix)


def _compose(first: Sequence[Block], second: Sequence[Block]) -> list[tuple[int, int, int, int]]:
    """``(a, m, b, size)`` runs matched by both alignments: base ``a`` → mid ``m`` → new ``b``."""
    out = []
    i = j = 0
    while i < len(first) and j < len(second):
        x, y = first[i], second[j]
        lo, hi = max(x.b, y.a), min(x.b + x.size, y.a + y.size)
        if lo < hi:
            out.append((x.a + lo - x.b, lo, y.b + lo - y.a, hi - lo))
        if x.b + x.size <= y.a + y.size:
            i += 1
        else:
            j += 1
    return out


def _touching(
    hunks: Sequence[Hunk], lo: Callable[[Hunk], int], hi: Callable[[Hunk], int], m0: int, m1: int
) -> list[Hunk]:
    """Hunks whose closed range ``[lo, hi]`` meets ``[m0, m1]`` (an empty range still touches its spot)."""
    return [h for h in hunks if lo(h) <= m1 and hi(h) >= m0]


def explain_composed(
    base: Sequence[int],
    mid: Sequence[int],
    new: Sequence[int],
    label: tuple[Mode, Source],
    *,
    decode: Decoder | None = None,
    limits: AlignLimits = DEFAULT_LIMITS,
) -> Explanation:
    """Base → ``mid`` (the template's changes, by the rule) then ``mid`` → ``new`` (``label``'s), composed.

    ``mid`` is the new render without the client's edits of earlier messages; the result has
    ``apply(base, D)`` a prefix of ``new``. A hunk that meets a client edit takes its label
    (``forget`` if either side's is); every other hunk is the template's.
    """
    n = len(base)
    first = matching_blocks(base, mid, suffix=False, limits=limits)
    template = _label(base, mid, _raw_hunks(first, n, len(mid), True), (), decode)
    second = matching_blocks(mid, new, suffix=True, limits=limits)
    client = [Hunk(*h, label[0], label[1]) for h in _raw_hunks(second, len(mid), len(new), False)]
    hunks = []
    pa = pm = pb = 0
    for a, m, b, size in [*_compose(first, second), (n, len(mid), len(new), -1)]:
        end = size < 0  # past the last run: the base's unmatched end is dropped, the rest is new
        if a > pa or (b > pb and not end):
            b, m = (pb, len(mid)) if end else (b, m)
            theirs = _touching(client, lambda h: h.a0, lambda h: h.a1, pm, m)
            ours = _touching(template, lambda h: h.b0, lambda h: h.b1, pm, m)
            forget = any(h.mode is Mode.FORGET for h in theirs + ours) or not (theirs or ours)
            source = theirs[0].source if theirs else Source.TEMPLATE
            hunks.append(Hunk(pa, a, pb, b, Mode.FORGET if forget else Mode.AMORTIZE, source))
        pa, pm, pb = a + size, m + size, b + size
    return _finish(base, new, hunks, True)
