"""From "these messages changed" to exact token-span directives.

:func:`diff_to_directives` compares two renderings of a conversation (before and after an edit)
message by message:

1. Each rendering is cut into *cells*: the head (template preamble), one per message (its
   span) and the tail (generation prompt). Equal leading and trailing cells are skipped; the
   rest are matched between old and new by their token content (``difflib`` on cell keys),
   which localises replaced, inserted and removed messages.
2. Each unmatched block of cells becomes one directive over the block's old token range, with
   the common token prefix and suffix inside the block trimmed away.
3. A block's mode is ``forget`` if any message in it was marked ``forget`` (by old index in
   ``modes`` or new index in ``new_modes``), else ``default``.
4. The result is verified: ``apply(old.tokens, D) == new.tokens``. Anything that does not check
   out — an unstable template, a failed verification — becomes one ``forget`` directive from the
   first differing token. Never a directive that reproduces the wrong tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from difflib import SequenceMatcher

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.render.rendering import RenderedConversation

__all__ = [
    "diff_to_directives",
    "diff_tokens",
    "diff_token_sequences",
    "forget_from_first_difference",
    "common_prefix_length",
]


def _cell_starts(conv: RenderedConversation) -> list[int]:
    """Start of each cell (head, messages, tail) followed by the total length."""
    starts = [0] + [span.start for span in conv.message_spans]
    starts.append(conv.message_spans[-1].end if conv.message_spans else 0)
    starts.append(len(conv.tokens))
    return starts


def _cell_keys(tokens: Sequence[int], starts: Sequence[int]) -> list[tuple[int, ...]]:
    return [tuple(tokens[a:b]) for a, b in zip(starts, starts[1:], strict=False)]


_CHUNK = 512  # tokens compared per slice: C-speed list comparison, then a short scan


def _same(a: Sequence[int], b: Sequence[int]) -> bool:
    """Element-wise equality of two slices (a list slice never equals a tuple slice)."""
    if type(a) is not type(b):
        return list(a) == list(b)
    return a == b


def _same_cell(
    a: Sequence[int], a_starts: Sequence[int], i: int, b: Sequence[int], b_starts: Sequence[int], j: int
) -> bool:
    return _same(a[a_starts[i] : a_starts[i + 1]], b[b_starts[j] : b_starts[j + 1]])


def _changed_cells(
    a: Sequence[int], a_starts: Sequence[int], b: Sequence[int], b_starts: Sequence[int]
) -> list[tuple[int, int, int, int]]:
    """Blocks of cells ``(i1, i2, j1, j2)`` that differ between two cut token sequences.

    Equal leading and trailing cells are skipped by slice comparison (linear, no hashing); only
    the middle goes through ``difflib``, whose non-equal opcodes are returned, shifted back.
    """
    n, m = len(a_starts) - 1, len(b_starts) - 1
    lo = 0
    while lo < min(n, m) and _same_cell(a, a_starts, lo, b, b_starts, lo):
        lo += 1
    hi = 0
    while hi < min(n, m) - lo and _same_cell(a, a_starts, n - 1 - hi, b, b_starts, m - 1 - hi):
        hi += 1
    old_keys = _cell_keys(a, a_starts[lo : n - hi + 1])
    new_keys = _cell_keys(b, b_starts[lo : m - hi + 1])
    matcher = SequenceMatcher(None, old_keys, new_keys, autojunk=False)
    return [(i1 + lo, i2 + lo, j1 + lo, j2 + lo) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def _common_prefix(a: Sequence[int], a0: int, a1: int, b: Sequence[int], b0: int, b1: int) -> int:
    limit = min(a1 - a0, b1 - b0)
    n = 0
    while n < limit:
        m = min(_CHUNK, limit - n)
        if _same(a[a0 + n : a0 + n + m], b[b0 + n : b0 + n + m]):
            n += m
            continue
        while a[a0 + n] == b[b0 + n]:
            n += 1
        return n
    return n


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return _common_prefix(a, 0, len(a), b, 0, len(b))


def _common_suffix(a: Sequence[int], a0: int, a1: int, b: Sequence[int], b0: int, b1: int) -> int:
    limit = min(a1 - a0, b1 - b0)
    n = 0
    while n < limit:
        m = min(_CHUNK, limit - n)
        if _same(a[a1 - n - m : a1 - n], b[b1 - n - m : b1 - n]):
            n += m
            continue
        while a[a1 - 1 - n] == b[b1 - 1 - n]:
            n += 1
        return n
    return n


def diff_tokens(
    old: Sequence[int],
    old_range: tuple[int, int],
    new: Sequence[int],
    new_range: tuple[int, int],
    mode: Mode,
) -> Directive | None:
    """One directive turning ``old[old_range]`` into ``new[new_range]``, trimmed; ``None`` if equal."""
    a0, a1 = old_range
    b0, b1 = new_range
    p = _common_prefix(old, a0, a1, new, b0, b1)
    a0, b0 = a0 + p, b0 + p
    s = _common_suffix(old, a0, a1, new, b0, b1)
    a1, b1 = a1 - s, b1 - s
    if a0 == a1 and b0 == b1:
        return None
    return Directive.model_construct(start=a0, end=a1, replacement=tuple(new[b0:b1]), mode=mode)


def forget_from_first_difference(old: Sequence[int], new: Sequence[int]) -> list[Directive]:
    """The conservative answer: recompute everything from the first differing token."""
    p = _common_prefix(old, 0, len(old), new, 0, len(new))
    if p == len(old) == len(new):
        return []
    return [Directive(start=p, end=len(old), replacement=tuple(new[p:]), mode=Mode.FORGET)]


def diff_to_directives(
    old: RenderedConversation,
    new: RenderedConversation,
    modes: Mapping[int, Mode] | None = None,
    new_modes: Mapping[int, Mode] | None = None,
    default: Mode = Mode.AMORTIZE,
) -> list[Directive]:
    """Directives that turn ``old.tokens`` into ``new.tokens``, localised by message.

    ``modes`` gives the mode of edits by *old* message index (replaced or removed messages),
    ``new_modes`` by *new* message index (inserted or replacing messages); unnamed messages get
    ``default``. The result always satisfies ``apply(old.tokens, result) == new.tokens``.
    """
    if not (old.prefix_stable and new.prefix_stable):
        return forget_from_first_difference(old.tokens, new.tokens)
    modes = modes or {}
    new_modes = new_modes or {}
    old_starts, new_starts = _cell_starts(old), _cell_starts(new)
    directives: list[Directive] = []
    for i1, i2, j1, j2 in _changed_cells(old.tokens, old_starts, new.tokens, new_starts):
        # cell k is message k - 1 (cell 0 is the head)
        forget = any(modes.get(i - 1) is Mode.FORGET for i in range(i1, i2)) or any(
            new_modes.get(j - 1) is Mode.FORGET for j in range(j1, j2)
        )
        d = diff_tokens(
            old.tokens,
            (old_starts[i1], old_starts[i2]),
            new.tokens,
            (new_starts[j1], new_starts[j2]),
            Mode.FORGET if forget else default,
        )
        if d is not None:
            directives.append(d)
    if apply(old.tokens, directives) != new.tokens:
        return forget_from_first_difference(old.tokens, new.tokens)
    return directives


def diff_token_sequences(
    old: Sequence[int], new: Sequence[int], mode: Mode = Mode.AMORTIZE, min_gap: int = 8
) -> list[Directive]:
    """Directives with ``apply(old, D) == new`` from the token sequences alone (no message spans).

    Used where only tokens are known (the server's auto-splice for clients that send no
    directives). After the common prefix, ``difflib`` aligns the rest; edits separated by fewer
    than ``min_gap`` equal tokens are merged so that a re-tokenized boundary does not become a
    swarm of tiny splices.
    """
    c = _common_prefix(old, 0, len(old), new, 0, len(new))
    if c == len(old) == len(new):
        return []
    matcher = SequenceMatcher(None, old[c:], new[c:], autojunk=len(old) - c > 2000)
    blocks: list[list[int]] = []  # [old_start, old_end, new_start, new_end]
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if blocks and i1 + c - blocks[-1][1] < min_gap and j1 + c - blocks[-1][3] < min_gap:
            blocks[-1][1], blocks[-1][3] = i2 + c, j2 + c
        else:
            blocks.append([i1 + c, i2 + c, j1 + c, j2 + c])
    directives = [
        Directive.model_construct(start=a0, end=a1, replacement=tuple(new[b0:b1]), mode=mode)
        for a0, a1, b0, b1 in blocks
    ]
    if apply(old, directives) != list(new):  # cannot happen with difflib's opcodes; never trust it
        return forget_from_first_difference(old, new)
    return directives
