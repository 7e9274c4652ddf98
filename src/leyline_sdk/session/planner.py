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

**The agent's own edits.** A seen message the agent changed itself (not a policy) is a *client*
edit; its mode is the session's ``client_edits`` setting (:data:`ClientEdits`): ``"auto"`` (the
default) splices content the agent removed or replaced by something shorter — a cleared tool
result, a placeholder, a summary: the eviction the splice exists for — in ``amortize`` mode, and
recomputes content it changed to something longer (a changed fact) from there (``forget``);
``"amortize"`` and ``"forget"`` apply one mode to every client edit. When the agent removed or
inserted messages (trimming, a summary replacing several), the messages no longer line up by
index: the base and the new prompt are aligned token by token (:func:`~leyline_sdk.explain.templates.explain`)
and every difference is the client's, in the mode the setting gives a removal (``forget`` if a
policy redacted something this turn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from leyline_sdk.core.directives import Directive, Mode, apply
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.explain.by_message import BlockLabel, pairs_by_index, realigned, seen_view
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.explain.identity import message_text
from leyline_sdk.explain.templates import Decoder, Label, Source, explain
from leyline_sdk.explain.turns import explain_turn, render_tokens
from leyline_sdk.render.rendering import RenderedConversation
from leyline_sdk.session.server_view import ServerView

__all__ = [
    "ClientEdits",
    "Plan",
    "Unplanned",
    "block_label",
    "client_mode",
    "hunk_label",
    "turn_plan",
    "sync_plan",
    "unedited_render",
]

ClientEdits = Literal["auto", "amortize", "forget"]  # the mode of the agent's own edits (module docstring)
CLIENT_EDITS = ("auto", "amortize", "forget")


def client_mode(setting: ClientEdits, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> Mode:
    """The mode of the agent's own edit of ``old`` into ``new`` (``None``: removed / inserted)."""
    if setting != "auto":
        return Mode(setting)
    if new is None:
        return Mode.AMORTIZE  # removed
    if old is None:
        return Mode.FORGET  # inserted: a fact the downstream never saw
    shorter = len(message_text(new.get("content"))) < len(message_text(old.get("content")))
    return Mode.AMORTIZE if shorter else Mode.FORGET


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


def _known(view: ServerView) -> None:
    if not view.knows_base:
        raise Unplanned(FallbackCode.BASE_MISMATCH, "the client does not know the server's base")


def _lines_up(view: ServerView, effective: Sequence[Mapping[str, Any]], prompt: RenderedConversation) -> bool:
    """Whether the request keeps the seen messages one for one (content may change; none moved)."""
    return len(prompt.message_spans) >= len(view.seen) and pairs_by_index(view.seen, effective)


def _changed(
    view: ServerView, effective: Sequence[Mapping[str, Any]], modes: Mapping[int, Mode], setting: ClientEdits
) -> dict[int, tuple[Mode, Source]]:
    """Seen messages that differ now, with their edit's mode and who made it (a policy or the client)."""
    out = {}
    for i, old in enumerate(view.seen):
        if effective[i] == old:
            continue
        if i in modes:
            out[i] = (modes[i], Source.POLICY)
        else:
            out[i] = (client_mode(setting, old, effective[i]), Source.CLIENT)
    return out


def turn_plan(
    view: ServerView,
    effective: Sequence[Mapping[str, Any]],
    prompt: RenderedConversation,
    modes: Mapping[int, Mode],
    unedited: Sequence[int] | None,
    decode: Decoder | None,
    client_edits: ClientEdits = "auto",
) -> Plan:
    """The next request's directives (raises :class:`Unplanned`); consumes ``view.pending_modes``."""
    _known(view)
    assert view.base_tokens is not None and view.seen_render is not None
    modes, view.pending_modes = {**view.pending_modes, **modes}, {}
    if not _lines_up(view, effective, prompt):  # the agent removed or inserted messages
        base, old = view.base_tokens, view.seen_render
        paired = realigned(base, old, prompt, view.seen, effective, block_label(client_edits, modes), decode)
        if paired is None:  # not pairable by message: aligned token by token
            redacted = any(m is Mode.FORGET for m in modes.values())
            label = hunk_label(Mode.FORGET if redacted else client_edits)
            paired = explain(base, prompt.tokens, prefix=True, decode=decode, default=label)
        return _verified(base, prompt, paired.directives, [s.value for s in paired.sources])
    k = len(view.seen)
    seen = seen_view(prompt, k, view.seen_render)
    explained = explain_turn(
        view.base_tokens,
        view.seen_render,
        prompt,
        k,
        _changed(view, effective, modes, client_edits),
        (lambda: unedited) if unedited is not None else None,
        decode,
    )
    plan = _verified(view.base_tokens, prompt, explained.directives, [s.value for s in explained.sources])
    return Plan(plan.directives, seen, plan.sources)


def block_label(setting: ClientEdits, policy_modes: Mapping[int, Mode]) -> BlockLabel:
    """A changed block's mode: the policy's where a policy edited one of its new messages, else the
    agent's by ``setting`` (``auto``: removed or shortened: ``amortize``; inserted or longer: ``forget``)."""

    def label(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], at: range) -> tuple[Mode, Source]:
        policy = [policy_modes[j] for j in at if j in policy_modes]
        if policy:
            return (Mode.FORGET if Mode.FORGET in policy else Mode.AMORTIZE), Source.POLICY
        if setting != "auto":
            return Mode(setting), Source.CLIENT
        before = sum(len(message_text(m.get("content"))) for m in old)
        after = sum(len(message_text(m.get("content"))) for m in new)
        return (Mode.AMORTIZE if old and after < before else Mode.FORGET), Source.CLIENT

    return label


def hunk_label(setting: ClientEdits | Mode) -> Label:
    """How a client's edit found only in the tokens is labelled: by the setting, where ``auto`` reads
    a hunk that got shorter as a removal (``amortize``) and anything else as a changed fact."""
    if isinstance(setting, Mode) or setting != "auto":
        return (Mode(setting), Source.CLIENT)

    def label(old: Sequence[int], new: Sequence[int]) -> tuple[Mode, Source]:
        return (Mode.AMORTIZE if len(new) < len(old) else Mode.FORGET, Source.CLIENT)

    return label


def _verified(
    base: Sequence[int], prompt: RenderedConversation, directives: list[Directive], sources: list[str]
) -> Plan:
    """The plan, once ``apply(base, D)`` is checked to be a prefix of the prompt."""
    result = apply(base, directives)
    if len(result) > len(prompt.tokens) or prompt.tokens[: len(result)] != result:
        raise Unplanned(FallbackCode.PROMPT_MISMATCH, "directives do not reproduce the prompt")
    return Plan(directives, prompt, sources)


def sync_plan(
    view: ServerView, effective: Sequence[Mapping[str, Any]], prompt: RenderedConversation, modes: Mapping[int, Mode]
) -> Plan | None:
    """``sync_edits``' directives for the seen messages; ``None``: left to the next request."""
    _known(view)
    if not _lines_up(view, effective, prompt):
        raise Unplanned(FallbackCode.PROMPT_MISMATCH, "the agent removed or inserted messages the server has seen")
    k = len(view.seen)
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
