"""One request's directives, the chat template's own edits included: what sessions and the server call.

:func:`explain_turn` (an SDK session) and :func:`explain_client_turn` (the server's auto-splice
for plain clients) explain the next prompt against the session's base (the previous prompt plus
its generated tokens):

* both renders prefix-stable and the template changed no message the client left alone: the
  message diff (:func:`~leyline_sdk.explain.diff.diff_to_directives`, each changed message in its edit's
  mode), plus the generated answer aligned with its re-render (a reasoning block the template
  drops from it is an ``amortize`` deletion, not a ``forget`` of the answer);
* otherwise the aligner of :mod:`leyline_sdk.explain.templates`: the client's edits located by the old
  render's message spans where those are exact; on an unstable template by a second render
  without the client's edits (``unedited``), composed.

Every answer is verified there: ``apply(base, D)`` is a prefix of the new prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from leyline_sdk.core.directives import Directive, Mode, apply, truncate_result
from leyline_sdk.explain.diff import common_prefix_length, diff_to_directives
from leyline_sdk.explain.templates import (
    Decoder,
    Explanation,
    Region,
    Source,
    Transcript,
    _fallback,
    _region_of,
    explain,
    explain_composed,
)
from leyline_sdk.render.rendering import HFChatTokenizer, RenderedConversation

__all__ = ["explain_turn", "explain_client_turn", "local_chat", "decoder_of", "render_tokens", "seen_view"]


def _seen_view(new: RenderedConversation, k: int, old: RenderedConversation) -> RenderedConversation:
    """The new rendering of the first ``k`` messages, followed by the old generation prompt."""
    end = new.message_spans[k - 1].end if k else new.head.end
    return RenderedConversation.model_construct(
        tokens=new.tokens[:end] + old.tokens[old.tail.start :],
        message_spans=new.message_spans[:k],
        prefix_stable=new.prefix_stable,
        unstable_reason=new.unstable_reason,
    )


def _regions(old: RenderedConversation, changed: Mapping[int, tuple[Mode, Source]]) -> list[Region]:
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


def _per_message(
    base: Sequence[int],
    old: RenderedConversation,
    new: RenderedConversation,
    k: int,
    changed: Mapping[int, tuple[Mode, Source]],
    decode: Decoder | None,
) -> Explanation | None:
    """Stable renders: the message diff, plus the generated answer aligned with its re-render.

    ``None`` when the template changed a message the client did not (or the head): the aligner's job.
    """
    seen = _seen_view(new, k, old)
    if old.tokens[: old.head.end] != seen.tokens[: seen.head.end] or any(
        i not in changed and old.message_tokens(i) != seen.message_tokens(i) for i in range(k)
    ):
        return None
    regions = _regions(old, changed)
    directives = diff_to_directives(old, seen, modes={i: mode for i, (mode, _) in changed.items()})
    result = apply(base, directives)
    if new.tokens[: len(result)] == result:
        return Explanation(directives, _by_region(directives, regions))
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
    return Explanation(combined, _by_region(directives, regions) + tail.sources, tail.fallback)


def explain_turn(
    base: Sequence[int],
    old: RenderedConversation,
    new: RenderedConversation,
    k: int,
    changed: Mapping[int, tuple[Mode, Source]],
    unedited: Callable[[], Sequence[int] | None] | None = None,
    decode: Decoder | None = None,
) -> Explanation:
    """Directives on ``base`` (``old``'s prompt + the generated tokens) with ``apply`` a prefix of ``new``.

    ``k`` messages were in ``old``; ``changed`` names those the client edited since (index →
    mode, source). ``unedited`` renders the new conversation with those edits undone (only
    asked for when ``old`` is not prefix-stable and something changed); without it the edits
    are located by ``old``'s approximate spans, and an edit found elsewhere falls to the rule.
    """
    if old.prefix_stable and new.prefix_stable and len(new.message_spans) >= k:
        fast = _per_message(base, old, new, k, changed, decode)
        if fast is not None:
            return fast
    mid = unedited() if changed and not old.prefix_stable and unedited is not None else None
    if mid is not None:
        forget = any(mode is Mode.FORGET for mode, _ in changed.values())
        source = Source.POLICY if any(s is Source.POLICY for _, s in changed.values()) else Source.CLIENT
        label = (Mode.FORGET if forget else Mode.AMORTIZE, source)
        return explain_composed(base, mid, new.tokens, label, decode=decode)
    return explain(base, new.tokens, _regions(old, changed), prefix=True, decode=decode)


def explain_client_turn(
    base: Sequence[int],
    previous: Transcript | None,
    current: Transcript,
    render_tokens: Callable[[list[dict[str, Any]], list[Any] | None], Sequence[int] | None],
    decode: Decoder | None = None,
) -> Explanation:
    """The server's view (``--auto-splice``): a plain client's request explained against its session.

    ``previous`` rendered the base's prompt. Messages the client changed are its edits
    (``amortize``, as auto-splice always did); the rest is the template's, by the rule. Without a
    usable ``previous`` (none, other tools, messages removed or re-roled, or the base spliced
    since) the server cannot tell who made an edit: every edit is the client's.
    """
    msgs, new = current.messages, current.render
    if previous is None or not _continues(base, previous, current):
        return explain(base, new.tokens, prefix=True, decode=decode, default=(Mode.AMORTIZE, Source.CLIENT))
    k = len(previous.messages)
    changed = {i: (Mode.AMORTIZE, Source.CLIENT) for i in range(k) if msgs[i] != previous.messages[i]}

    def unedited() -> Sequence[int] | None:
        return render_tokens(previous.messages + msgs[k:], current.tools)

    return explain_turn(base, previous.render, new, k, changed, unedited, decode)


def _continues(base: Sequence[int], previous: Transcript, current: Transcript) -> bool:
    """Whether ``current`` keeps ``previous``'s messages (content aside) and ``base`` starts with its prompt."""
    k, msgs, old = len(previous.messages), current.messages, previous.render.tokens
    return (
        previous.tools == current.tools
        and len(msgs) >= k
        and all(a.get("role") == b.get("role") for a, b in zip(previous.messages, msgs, strict=False))
        and len(base) >= len(old)
        and common_prefix_length(base, old) == len(old)
    )


def local_chat(renderer: Any) -> HFChatTokenizer | None:
    """The local chat tokenizer behind a session's renderer (``None`` when it renders on the server)."""
    tokenizer = getattr(renderer, "tokenizer", None)
    chat = getattr(tokenizer, "chat", tokenizer)  # an IncrementalRenderer wraps it
    return chat if isinstance(chat, HFChatTokenizer) else None


def decoder_of(chat: HFChatTokenizer | None) -> Decoder | None:
    """Token ids → text, exactly (special tokens kept, no clean-up), or ``None`` without a tokenizer."""
    if chat is None:
        return None
    tokenizer = chat.tokenizer

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    return decode


async def render_tokens(
    renderer: Any, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[int] | None:
    """The prompt tokens of ``messages`` (no spans): one template render locally, else the renderer's."""
    chat = local_chat(renderer)
    if chat is not None:
        return chat.encode(chat.render_text(messages, tools, True))[0]
    rendered = await renderer.render(messages, tools)
    return list(rendered.tokens) if rendered is not None else None


def seen_view(prompt: RenderedConversation, k: int, old: RenderedConversation) -> RenderedConversation:
    """The new rendering of the ``k`` messages the server has seen, then the base's generation prompt."""
    end = prompt.message_spans[k - 1].end if k else prompt.head.end
    return RenderedConversation.model_construct(
        tokens=prompt.tokens[:end] + old.tokens[old.tail.start :],
        message_spans=prompt.message_spans[:k],
        prefix_stable=prompt.prefix_stable,
        unstable_reason=prompt.unstable_reason,
    )
