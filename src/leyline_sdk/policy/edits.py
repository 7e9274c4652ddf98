"""Edits and the conversation they apply to: an immutable ``Conversation``, plain ``Edit``s.

A policy (:mod:`leyline_sdk.policy.contracts`) looks at a :class:`Conversation` and proposes :class:`Edit`s;
neither knows anything of tokens or KV. Edits keep the conversation well-formed: an edit replaces
a message's *content* (a stub), never removes a message, so every tool result still answers its
tool call. An edit says what kind of change it is (:class:`EditKind`): ``evict`` (stub an output
whose conclusions may stay: ``amortize``), ``redact`` (the content must leave the model's view:
``forget``) or ``correct`` (a fact changed: ``forget`` from the changed field, or an
:class:`~leyline_sdk.policy.errata.Erratum` appended at the end).

These contracts live in the SDK's pure core (no HTTP, no openai) because both sides need them:
sessions run policies (:mod:`leyline_sdk.policy.run`) and ``leyline_policies`` implements them.
The policy package depends on these modules; the SDK never imports the policy package.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from leyline_sdk.core.directives import Mode
from leyline_sdk.policy.errata import Erratum

__all__ = [
    "Conversation",
    "Edit",
    "EditKind",
    "Erratum",
    "Mode",
    "apply_edits",
    "merge_edits",
    "content_text",
    "as_mode",
]


def as_mode(mode: Mode | str) -> Mode:
    """``Mode.AMORTIZE`` / ``Mode.FORGET`` from the enum or its value (``ValueError`` naming both)."""
    try:
        return Mode(mode)
    except ValueError:
        raise ValueError(f"mode must be 'amortize' or 'forget', got {mode!r}") from None


def content_text(message: Mapping[str, Any]) -> str:
    """A message's content as text (content parts joined; ``None`` as empty)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))


@dataclass(frozen=True)
class Conversation:
    """An immutable snapshot of OpenAI-format messages (and tools) that policies read."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(
        cls, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> Conversation:
        """Snapshot ``messages`` (copied, so later changes by the agent do not leak in)."""
        return cls(tuple(dict(m) for m in messages), tuple(dict(t) for t in tools or ()))

    def tool_call(self, index: int) -> dict[str, Any] | None:
        """The assistant tool call that tool message ``index`` answers, if found."""
        message = self.messages[index]
        call_id = message.get("tool_call_id")
        for i in range(index - 1, -1, -1):
            for call in self.messages[i].get("tool_calls") or ():
                if call.get("id") == call_id:
                    return dict(call)
        return None

    def tool_name_and_args(self, index: int) -> tuple[str, dict[str, Any]]:
        """(tool name, parsed arguments) of the call tool message ``index`` answers."""
        call = self.tool_call(index)
        if call is None:
            return str(self.messages[index].get("name", "tool")), {}
        fn = call.get("function") or {}
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = {"arguments": args}
        return str(fn.get("name", "tool")), args if isinstance(args, dict) else {"arguments": args}

    @cached_property
    def _assistants_after(self) -> list[int]:
        """``[i]``: assistant messages strictly after message ``i`` (one pass, computed once)."""
        counts = [0] * len(self.messages)
        running = 0
        for i in range(len(self.messages) - 1, -1, -1):
            counts[i] = running
            running += self.messages[i].get("role") == "assistant"
        return counts

    def assistant_turns_after(self, index: int) -> int:
        """Assistant messages strictly after ``index``."""
        return self._assistants_after[index]

    def calling_turn(self, index: int) -> int:
        """Index of the assistant message whose call tool message ``index`` answers (else ``index``)."""
        call_id = self.messages[index].get("tool_call_id")
        for i in range(index - 1, -1, -1):
            if any(c.get("id") == call_id for c in self.messages[i].get("tool_calls") or ()):
                return i
        return index


class EditKind(str, Enum):
    """What an edit changes for the model; it decides the edit's default mode.

    * ``evict`` — stub an output whose conclusions may stay (``amortize``: downstream tokens keep
      the notes they took from it). Right for a stale output whose facts still hold.
    * ``redact`` — the content must leave the model's view (``forget``: everything from the edit
      on is recomputed).
    * ``correct`` — a fact changed. Either ``forget`` from the changed field (the new value in
      place, everything after it recomputed), or an *erratum* (:attr:`Edit.erratum`): the old
      output stays, a short correction is appended at the end, nothing is invalidated.
    """

    EVICT = "evict"
    REDACT = "redact"
    CORRECT = "correct"


_RANK = {EditKind.EVICT: 0, EditKind.CORRECT: 1, EditKind.REDACT: 2}


def _resolve(kind: EditKind | str | None, mode: Mode | str | None, erratum: Erratum | None) -> tuple[EditKind, Mode]:
    """The (kind, mode) of an edit: each derived from the other where not given; contradictions raise."""
    if kind is None:
        m = as_mode(mode) if mode is not None else Mode.AMORTIZE
        k = EditKind.CORRECT if erratum is not None else EditKind.REDACT if m is Mode.FORGET else EditKind.EVICT
        return k, m
    try:
        k = EditKind(kind)
    except ValueError:
        raise ValueError(f"kind must be 'evict', 'redact' or 'correct', got {kind!r}") from None
    if mode is not None:
        m = as_mode(mode)
    else:
        m = Mode.AMORTIZE if k is EditKind.EVICT or erratum is not None else Mode.FORGET
    if k is EditKind.REDACT and m is not Mode.FORGET:
        raise ValueError("a redact edit must be 'forget': redacted content must leave the model's view")
    if k is EditKind.CORRECT and erratum is None and m is not Mode.FORGET:
        raise ValueError(
            "a correct edit needs mode 'forget' or an erratum: amortize would keep the model reasoning on the old value"
        )
    if k is EditKind.EVICT and erratum is not None:
        raise ValueError("an erratum belongs to a 'correct' (or 'redact') edit, not to 'evict'")
    return k, m


@dataclass(frozen=True, init=False)
class Edit:
    """Replace message ``index``'s content by ``replacement``; say what kind of change it is.

    ``kind`` (:class:`EditKind`) and ``mode`` (a :class:`~leyline_sdk.core.directives.Mode`; the strings
    ``"amortize"`` / ``"forget"`` are accepted) are derived from each other where one is left out:
    ``evict`` → ``amortize``, ``redact`` → ``forget``, ``correct`` → ``forget``, or ``amortize``
    with an erratum; without a kind, ``forget`` reads as ``redact`` and ``amortize`` as ``evict``.
    ``replacement=None`` leaves the content as it is (an erratum-only correction). ``erratum`` (a
    text or an :class:`~leyline_sdk.policy.errata.Erratum`) is appended after the last message when
    first issued and stays there. ``field`` names the message field the replacement goes to
    (``"content"``; ``"reasoning_content"`` for reasoning kept beside the content)::

        Edit(3, "[evicted: read_file(path=\"a.py\") output, 1,234 chars]")          # evict, amortize
        Edit(1, "my key is [redacted]", kind="redact")                             # forget
        Edit(3, None, kind="correct", erratum="a.py changed after it was read: ...")  # amortize + erratum
    """

    index: int
    replacement: str | None
    mode: Mode
    reason: str
    policy: str
    removed_chars: int = field(compare=False)
    kind: EditKind
    erratum: Erratum | None
    field: str

    def __init__(
        self,
        index: int,
        replacement: str | None,
        mode: Mode | str | None = None,
        reason: str = "",
        policy: str = "",
        removed_chars: int = 0,
        *,
        kind: EditKind | str | None = None,
        erratum: Erratum | str | None = None,
        field: str = "content",
    ) -> None:
        if field in ("role", "tool_calls", "tool_call_id") or not field:
            raise ValueError(f"an edit replaces content, not {field!r}")
        if replacement is not None and not isinstance(replacement, str):
            raise TypeError(f"replacement must be a string or None, got {type(replacement).__name__}")
        note = Erratum(erratum) if isinstance(erratum, str) else erratum
        if replacement is None and note is None:
            raise ValueError("an edit needs a replacement, an erratum, or both")
        k, m = _resolve(kind, mode, note)
        for name, value in (
            ("index", index),
            ("replacement", replacement),
            ("mode", m),
            ("reason", reason),
            ("policy", policy),
            ("removed_chars", removed_chars),
            ("kind", k),
            ("erratum", note),
            ("field", field),
        ):
            object.__setattr__(self, name, value)


def apply_edits(messages: Sequence[Mapping[str, Any]], edits: Sequence[Edit]) -> list[dict[str, Any]]:
    """The messages with every edit's replacement applied (later edits to the same message win).

    Errata are not inserted here (indices stay those of ``messages``); ``run_policies`` does that.
    """
    out = [dict(m) for m in messages]
    for edit in edits:
        if not 0 <= edit.index < len(out):
            raise IndexError(f"edit names message {edit.index}; the conversation has {len(out)}")
        if edit.replacement is not None:
            out[edit.index][edit.field] = edit.replacement
    return out


def merge_edits(earlier: Edit, later: Edit, keep_forget: bool = True) -> Edit:
    """One edit for a message two edits name.

    The content is ``later``'s unless it leaves it (``None``) or repeats ``earlier``'s; an erratum
    once given is kept (``earlier``'s first: errata are byte-stable). Within one turn
    (``keep_forget``) ``forget`` is never downgraded and the stronger kind wins (``redact`` over
    ``correct`` over ``evict``); across turns the new content brings its own mode, since the old
    one was already realised.
    """
    new_content = later.replacement is not None and later.replacement != earlier.replacement
    source = later if new_content else earlier
    erratum = earlier.erratum or later.erratum
    mode = source.mode
    kind = source.kind
    if keep_forget:
        mode = Mode.FORGET if Mode.FORGET in (earlier.mode, later.mode) else mode
        kind = max(earlier.kind, later.kind, key=_RANK.__getitem__)
    if erratum is not None and kind is EditKind.EVICT:
        kind = EditKind.CORRECT
    told = new_content or (later.erratum is not None and earlier.erratum is None)
    return Edit(
        earlier.index,
        source.replacement,
        mode,
        later.reason if told else earlier.reason,
        later.policy if told else earlier.policy,
        source.removed_chars,
        kind=kind,
        erratum=erratum,
        field=source.field,
    )
