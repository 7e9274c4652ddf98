"""Policy contracts: an immutable ``Conversation``, plain ``Edit``s, the ``Policy`` protocol.

A policy looks at the conversation and proposes edits; it knows nothing of tokens or KV::

    class Policy(Protocol):
        name: str
        def propose(self, conversation: Conversation) -> list[Edit]: ...

Edits keep the conversation well-formed: an edit replaces a message's *content* (a stub), never
removes a message, so every tool result still answers its tool call. Plain functions
``(Conversation) -> list[Edit]`` are policies too (:func:`as_policy`), and policies compose with
``|`` into a :class:`~leyline_policies.chain.Chain`. ``Mode`` is the SDK's
(``leyline_sdk.directives``, the pure directive algebra: the only SDK module policies use).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from leyline_sdk.directives import Mode

__all__ = [
    "Conversation",
    "Edit",
    "Mode",
    "Policy",
    "PolicyBase",
    "FunctionPolicy",
    "as_policy",
    "apply_edits",
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


@dataclass(frozen=True)
class Edit:
    """Replace message ``index``'s content by ``replacement``, realised per ``mode``.

    ``mode`` is a :class:`~leyline_sdk.directives.Mode`; the strings ``"amortize"`` and
    ``"forget"`` are accepted and normalised to it.
    """

    index: int
    replacement: str
    mode: Mode = Mode.AMORTIZE
    reason: str = ""
    policy: str = ""
    removed_chars: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", as_mode(self.mode))


@runtime_checkable
class Policy(Protocol):
    """Anything with a ``name`` and ``propose(conversation) -> list[Edit]``."""

    name: str

    def propose(self, conversation: Conversation) -> list[Edit]:
        """The edits this policy wants now."""
        ...


class PolicyBase:
    """Convenience base: ``|`` chains policies."""

    name: str = "policy"

    def propose(self, conversation: Conversation) -> list[Edit]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __or__(self, other: Policy | Callable[[Conversation], list[Edit]]) -> Policy:
        from leyline_policies.chain import Chain

        return Chain(self, other)


class FunctionPolicy(PolicyBase):
    """A plain function used as a policy."""

    def __init__(self, fn: Callable[[Conversation], list[Edit]], name: str | None = None) -> None:
        self.fn = fn
        self.name = str(name or getattr(fn, "__name__", "function"))

    def propose(self, conversation: Conversation) -> list[Edit]:
        """Call the function."""
        return list(self.fn(conversation))


def as_policy(obj: Policy | Callable[[Conversation], list[Edit]]) -> Policy:
    """A policy object from a policy or a plain function."""
    if isinstance(obj, Policy):
        return obj
    if callable(obj):
        return FunctionPolicy(obj)
    raise TypeError(f"not a policy: {obj!r}")


def apply_edits(messages: Sequence[Mapping[str, Any]], edits: Sequence[Edit]) -> list[dict[str, Any]]:
    """The messages with every edit applied (later edits to the same message win)."""
    out = [dict(m) for m in messages]
    for edit in edits:
        if not 0 <= edit.index < len(out):
            raise IndexError(f"edit names message {edit.index}; the conversation has {len(out)}")
        out[edit.index]["content"] = edit.replacement
    return out
