"""Two renders of a conversation explained message by message, the generated answer included.

Both renders prefix-stable: the base is the old prompt plus the generated answer; the new prompt
re-renders the messages the server has seen (edited or not) and adds new ones. Two ways to pair
old messages with new:

* :func:`by_index` — the request keeps the seen messages one for one (count and roles), some
  with new content: message ``i`` is message ``i``;
* :func:`realigned` — the agent removed or inserted messages (trimming, a summary for several):
  old and new messages are paired by content (a message diff), and each block of changed ones
  gets a mode from a label (removals, replacements, insertions).

Then the message diff (:func:`~leyline_sdk.explain.diff.diff_to_directives`) over the paired
renders, plus the generated answer aligned with its re-render (a reasoning block the template
drops from it is an ``amortize`` deletion, not a ``forget`` of the answer). Every answer is
verified: ``apply(base, D)`` is a prefix of the new prompt; ``None`` hands the turn to the aligner.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from difflib import SequenceMatcher
from typing import Any

from leyline_sdk.core.directives import Directive, Mode, apply, truncate_result
from leyline_sdk.explain.diff import common_prefix_length, diff_to_directives
from leyline_sdk.explain.templates import Decoder, Explanation, Region, Source, _fallback, _region_of, explain
from leyline_sdk.render.rendering import RenderedConversation

__all__ = ["BlockLabel", "by_index", "fixed_label", "pairs_by_index", "realigned", "regions_of", "seen_view"]

# (old messages of a changed block, its new messages, their new indices) -> (mode, source) of the edit
BlockLabel = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], range], tuple[Mode, Source]]


def fixed_label(mode: Mode, source: Source = Source.CLIENT) -> BlockLabel:
    """Every changed block in one mode."""

    def label(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], at: range) -> tuple[Mode, Source]:
        return mode, source

    return label


def seen_view(new: RenderedConversation, k: int, old: RenderedConversation) -> RenderedConversation:
    """The new rendering of the first ``k`` messages, followed by the old generation prompt."""
    end = new.message_spans[k - 1].end if k else new.head.end
    return RenderedConversation.model_construct(
        tokens=new.tokens[:end] + old.tokens[old.tail.start :],
        message_spans=new.message_spans[:k],
        prefix_stable=new.prefix_stable,
        unstable_reason=new.unstable_reason,
    )


def regions_of(old: RenderedConversation, changed: Mapping[int, tuple[Mode, Source]]) -> list[Region]:
    spans = old.message_spans
    return [
        Region(spans[i].start, spans[i].end, mode, src) for i, (mode, src) in sorted(changed.items()) if i < len(spans)
    ]


def _by_region(directives: Sequence[Directive], regions: Sequence[Region]) -> list[Source]:
    out = []
    for d in directives:
        k = _region_of(regions, d.start, d.end)
        out.append(regions[k].source if k >= 0 else Source.TEMPLATE)
    return out


def by_index(
    base: Sequence[int],
    old: RenderedConversation,
    new: RenderedConversation,
    k: int,
    changed: Mapping[int, tuple[Mode, Source]],
    decode: Decoder | None,
) -> Explanation | None:
    """Seen messages kept one for one: the message diff, plus the generated answer aligned with its re-render.

    ``None`` when the template changed a message the client did not (or the head): the aligner's job.
    """
    seen = seen_view(new, k, old)
    if old.tokens[: old.head.end] != seen.tokens[: seen.head.end] or any(
        i not in changed and old.message_tokens(i) != seen.message_tokens(i) for i in range(k)
    ):
        return None
    regions = regions_of(old, changed)
    directives = diff_to_directives(old, seen, modes={i: mode for i, (mode, _) in changed.items()})
    return _with_answer(base, old, new, directives, regions, decode)


def _with_answer(
    base: Sequence[int],
    old: RenderedConversation,
    new: RenderedConversation,
    directives: list[Directive],
    regions: Sequence[Region],
    decode: Decoder | None,
) -> Explanation:
    """``directives`` on the seen messages (``regions``: who edited what), completed by the generated
    answer against its re-render."""
    result = apply(base, directives)
    sources = _by_region(directives, regions)
    if new.tokens[: len(result)] == result:
        return Explanation(directives, sources)
    if any(d.mode is Mode.FORGET for d in directives):  # recomputed from there anyway: cut where they differ
        cut = truncate_result(len(base), directives, common_prefix_length(result, new.tokens))
        return Explanation(cut, _by_region(cut, regions))
    t0 = old.tail.start  # the generation prompt and the generated answer: the template re-rendered them
    shift = sum(d.delta for d in directives)
    tail = explain(base[t0:], new.tokens[t0 + shift :], prefix=True, decode=decode)
    moved = [d.model_copy(update={"start": d.start + t0, "end": d.end + t0}) for d in tail.directives]
    combined = directives + moved
    result = apply(base, combined)
    if new.tokens[: len(result)] != result:
        return _fallback(base, new.tokens, True, "the generated answer did not align with its re-render")
    return Explanation(combined, sources + tail.sources, tail.fallback)


def _key(message: Mapping[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)


def _opcodes(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[tuple[str, int, int, int, int]]:
    matcher = SequenceMatcher(None, [_key(m) for m in old], [_key(m) for m in new], autojunk=False)
    return [op for op in matcher.get_opcodes() if op[1] < len(old)]  # the blocks that touch old messages


def pairs_by_index(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> bool:
    """Whether message ``i`` of ``new`` is the (maybe edited) message ``i`` of ``old`` for every old
    one: as many messages, the same roles, and no pairing by content that keeps more of them
    unchanged (an exchange the agent dropped shifts the rest, which then match elsewhere)."""
    if len(new) < len(old) or any(a.get("role") != b.get("role") for a, b in zip(old, new, strict=False)):
        return False
    by_index = sum(a == b for a, b in zip(old, new, strict=False))
    by_content = sum(i2 - i1 for tag, i1, i2, _, _ in _opcodes(old, new) if tag == "equal")
    return by_content <= by_index


def realigned(
    base: Sequence[int],
    old: RenderedConversation,
    new: RenderedConversation,
    old_messages: Sequence[Mapping[str, Any]],
    new_messages: Sequence[Mapping[str, Any]],
    label: BlockLabel,
    decode: Decoder | None = None,
) -> Explanation | None:
    """The agent removed or inserted messages: old and new paired by content, each changed block in
    ``label``'s mode (see the module docstring); ``None`` when the renders cannot be paired."""
    if not (old.prefix_stable and new.prefix_stable) or len(old.message_spans) != len(old_messages):
        return None
    k = len(old_messages)
    touching = _opcodes(old_messages, new_messages)
    blocks = [op for op in touching if op[0] != "equal"]
    if not blocks:
        return None
    m = max(op[4] for op in touching)
    if m > len(new.message_spans):
        return None
    seen = seen_view(new, m, old)
    if old.tokens[: old.head.end] != seen.tokens[: seen.head.end]:
        return None
    modes: dict[int, Mode] = {}
    new_modes: dict[int, Mode] = {}
    regions = []
    for _, i1, i2, j1, j2 in blocks:
        mode, source = label(old_messages[i1:i2], new_messages[j1:j2], range(j1, j2))
        modes.update({i: mode for i in range(i1, i2)})
        new_modes.update({j: mode for j in range(j1, j2)})
        spans = old.message_spans
        start = spans[i1].start if i1 < k else old.tail.start
        end = spans[i2 - 1].end if i2 > i1 else start
        regions.append(Region(start, end, mode, source))
    directives = diff_to_directives(old, seen, modes=modes, new_modes=new_modes)
    return _with_answer(base, old, new, directives, regions, decode)
