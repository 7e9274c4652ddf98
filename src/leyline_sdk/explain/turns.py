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

from leyline_sdk.core.directives import Mode
from leyline_sdk.explain.by_message import by_index, fixed_label, pairs_by_index, realigned, regions_of
from leyline_sdk.explain.diff import common_prefix_length
from leyline_sdk.explain.templates import Decoder, Explanation, Source, Transcript, explain, explain_composed
from leyline_sdk.render.rendering import HFChatTokenizer, RenderedConversation

__all__ = ["explain_turn", "explain_client_turn", "local_chat", "decoder_of", "render_tokens"]


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
        fast = by_index(base, old, new, k, changed, decode)
        if fast is not None:
            return fast
    mid = unedited() if changed and not old.prefix_stable and unedited is not None else None
    if mid is not None:
        forget = any(mode is Mode.FORGET for mode, _ in changed.values())
        source = Source.POLICY if any(s is Source.POLICY for _, s in changed.values()) else Source.CLIENT
        label = (Mode.FORGET if forget else Mode.AMORTIZE, source)
        return explain_composed(base, mid, new.tokens, label, decode=decode)
    return explain(base, new.tokens, regions_of(old, changed), prefix=True, decode=decode)


def explain_client_turn(
    base: Sequence[int],
    previous: Transcript | None,
    current: Transcript,
    render_tokens: Callable[[list[dict[str, Any]], list[Any] | None], Sequence[int] | None],
    decode: Decoder | None = None,
    client_mode: Mode = Mode.AMORTIZE,
) -> Explanation:
    """The server's view of a plain client's request, explained against its session.

    ``previous`` rendered the base's prompt. Messages the client changed are its edits, in
    ``client_mode`` (``forget``: recomputed from the first one, exact); the rest is the template's,
    by the rule. Messages removed or inserted: old and new paired by content
    (:func:`~leyline_sdk.explain.by_message.realigned`), every changed block the client's. Without a
    usable ``previous`` (none, other tools, or the base spliced since) the server cannot tell who
    made an edit: every difference is the client's.
    """
    msgs, new = current.messages, current.render
    if previous is None or not _continues(base, previous, current):
        paired = None
        if previous is not None and previous.tools == current.tools and _starts(base, previous):
            paired = realigned(base, previous.render, new, previous.messages, msgs, fixed_label(client_mode), decode)
        if paired is not None:
            return paired
        return explain(base, new.tokens, prefix=True, decode=decode, default=(client_mode, Source.CLIENT))
    k = len(previous.messages)
    changed = {i: (client_mode, Source.CLIENT) for i in range(k) if msgs[i] != previous.messages[i]}

    def unedited() -> Sequence[int] | None:
        return render_tokens(previous.messages + msgs[k:], current.tools)

    return explain_turn(base, previous.render, new, k, changed, unedited, decode)


def _starts(base: Sequence[int], previous: Transcript) -> bool:
    """Whether ``base`` starts with ``previous``'s prompt (it was not spliced since)."""
    old = previous.render.tokens
    return len(base) >= len(old) and common_prefix_length(base, old) == len(old)


def _continues(base: Sequence[int], previous: Transcript, current: Transcript) -> bool:
    """Whether ``current`` keeps ``previous``'s messages (content aside) and ``base`` starts with its prompt."""
    return (
        previous.tools == current.tools
        and pairs_by_index(previous.messages, current.messages)
        and _starts(base, previous)
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
