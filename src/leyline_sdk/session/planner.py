"""From the effective messages to the directives a session sends: the planning half of a turn.

A session knows the server's base (:class:`~leyline_sdk.session.server_view.ServerView`) and the
effective messages of the next request; this module computes the directives that turn the base
into a prefix of the new prompt, or says why none can be sent (a fallback code):

* :func:`turn_plan` — for a request: the edits of the messages the server has seen, the chat
  template's own edits and the generated answer's re-render included
  (:func:`~leyline_sdk.explain.turns.explain_turn`);
* :func:`sync_plan` — for ``sync_edits`` (no generation): only the seen messages' edits, by
  message diff; on an unstable template they are left to the next request.

Every plan is verified here: ``apply(base, D)`` reproduces the new prompt's tokens (a prefix of
them for a request). Pure apart from :func:`unedited_render`, which may render once more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.explain.templates import Decoder, Source
from leyline_sdk.explain.turns import explain_turn, render_tokens, seen_view
from leyline_sdk.render.rendering import RenderedConversation
from leyline_sdk.session.server_view import ServerView

__all__ = ["Plan", "Unplanned", "turn_plan", "sync_plan", "unedited_render"]


@dataclass(frozen=True)
class Plan:
    """Directives on the base, the seen messages' new rendering, and who made each directive."""

    directives: list[Directive]
    seen: RenderedConversation
    sources: list[str]


class Unplanned(Exception):
    """No directives can be sent; ``code`` says why (a :class:`FallbackCode`)."""

    def __init__(self, code: FallbackCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _check_seen(view: ServerView, effective: Sequence[Mapping[str, Any]], prompt: RenderedConversation) -> int:
    """The number of seen messages ``k``, after checking the request keeps them (roles and count)."""
    if not view.knows_base:
        raise Unplanned(FallbackCode.BASE_MISMATCH, "the client does not know the server's base")
    k = len(view.seen)
    if min(len(effective), len(prompt.message_spans)) < k or any(
        a.get("role") != b.get("role") for a, b in zip(effective, view.seen, strict=False)
    ):
        raise Unplanned(FallbackCode.PROMPT_MISMATCH, "the agent rewrote messages the server has seen")
    return k


def _changed(
    view: ServerView, effective: Sequence[Mapping[str, Any]], modes: Mapping[int, Mode]
) -> dict[int, tuple[Mode, Source]]:
    """Seen messages that differ now, with their edit's mode and who made it (a policy or the client)."""
    return {
        i: (modes.get(i, Mode.AMORTIZE), Source.POLICY if i in modes else Source.CLIENT)
        for i in range(len(view.seen))
        if effective[i] != view.seen[i]
    }


def turn_plan(
    view: ServerView,
    effective: Sequence[Mapping[str, Any]],
    prompt: RenderedConversation,
    modes: Mapping[int, Mode],
    unedited: Sequence[int] | None,
    decode: Decoder | None,
) -> Plan:
    """The next request's directives (raises :class:`Unplanned`); consumes ``view.pending_modes``."""
    k = _check_seen(view, effective, prompt)
    assert view.base_tokens is not None and view.seen_render is not None
    seen = seen_view(prompt, k, view.seen_render)
    modes, view.pending_modes = {**view.pending_modes, **modes}, {}
    explained = explain_turn(
        view.base_tokens,
        view.seen_render,
        prompt,
        k,
        _changed(view, effective, modes),
        (lambda: unedited) if unedited is not None else None,
        decode,
    )
    result = apply(view.base_tokens, explained.directives)
    if len(result) > len(prompt.tokens) or prompt.tokens[: len(result)] != result:
        raise Unplanned(FallbackCode.PROMPT_MISMATCH, "directives do not reproduce the prompt")
    return Plan(explained.directives, seen, [s.value for s in explained.sources])


def sync_plan(
    view: ServerView, effective: Sequence[Mapping[str, Any]], prompt: RenderedConversation, modes: Mapping[int, Mode]
) -> Plan | None:
    """``sync_edits``' directives for the seen messages; ``None``: left to the next request."""
    k = _check_seen(view, effective, prompt)
    assert view.base_tokens is not None and view.seen_render is not None
    old = view.seen_render
    seen = seen_view(prompt, k, old)
    if not (old.prefix_stable and prompt.prefix_stable):
        view.pending_modes.update(modes)  # spans of an unstable render are approximate:
        return None  # the next request explains these edits, in their modes
    directives = diff_to_directives(old, seen, modes=dict(modes))
    if apply(view.base_tokens, directives)[: len(seen.tokens)] != seen.tokens:
        raise Unplanned(FallbackCode.PROMPT_MISMATCH, "directives do not reproduce the prompt")
    return Plan(directives, seen, [])


async def unedited_render(
    view: ServerView,
    effective: list[dict[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    renderer: Any,
) -> list[int] | None:
    """On an unstable template, the prompt rendered without this turn's edits of seen messages.

    ``explain_turn`` tells the template's edits from the policies' with it (the message spans of
    an unstable rendering are approximate). ``None`` when it is not needed.
    """
    old, k = view.seen_render, len(view.seen)
    if old is None or old.prefix_stable or len(effective) < k or effective[:k] == view.seen:
        return None
    return await render_tokens(renderer, view.seen + effective[k:], tools)
