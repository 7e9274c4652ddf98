"""Errata: short, salient corrections appended to the conversation instead of rewriting it.

A model takes notes at prefill: tokens after a tool output carry conclusions drawn from it. When
a *fact* in that output changed (a file written after it was read, a status flipped), replacing
the old value in place with an ``amortize`` splice leaves the model reasoning on the old value.
An erratum leaves the old output where it is (nothing is invalidated, the prefix cache stays
aligned, it works on any OpenAI server) and appends a correction the model reads last::

    {"role": "user", "content": "[erratum] The earlier output of read_file(path=\"app.py\") is outdated: ..."}

The role is ``user`` by default (every chat template renders a user message after a tool
result); ``system`` works with templates that accept a system message mid-conversation. The
``[erratum]`` marker opens the content.

Errata are **byte-stable**: a policy proposes one as part of an :class:`~leyline_sdk.policy.edits.Edit`
(``kind="correct"``); :func:`~leyline_sdk.policy.run.run_policies` anchors it after the last
message of the history at that turn (``anchor``, a full-history index, and ``seq``, the issue
order) and keeps it sticky, so every later turn renders it at the same place, byte for byte,
even if the inputs it was written from are evicted later. An erratum is never placed inside a
tool exchange: while the history ends with tool calls that are not all answered, it waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ERRATUM_MARKER", "Erratum", "insert_errata", "pending_tool_calls"]

ERRATUM_MARKER = "[erratum]"


@dataclass(frozen=True)
class Erratum:
    """A correction message: ``text`` under ``role``; placed after full-history message ``anchor``.

    ``anchor`` and ``seq`` are set by ``run_policies`` when the erratum is first issued (a policy
    leaves them ``None`` / 0)::

        Erratum("app.py was rewritten after it was read; see the write_file call.").message()
        # {"role": "user", "content": "[erratum] app.py was rewritten after it was read; ..."}
    """

    text: str
    role: str = "user"
    anchor: int | None = None
    seq: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("an erratum needs a non-empty text")
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"an erratum's role must be a non-empty string, got {self.role!r}")

    def message(self) -> dict[str, Any]:
        """The chat message this erratum renders as."""
        return {"role": self.role, "content": f"{ERRATUM_MARKER} {self.text}"}


def pending_tool_calls(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the conversation ends inside a tool exchange (tool calls not all answered yet).

    Answers are matched by ``tool_call_id``; calls without ids are counted instead.
    """
    answered: set[Any] = set()
    count = 0
    for message in reversed(messages):
        role = message.get("role")
        if role == "tool":
            answered.add(message.get("tool_call_id"))
            count += 1
            continue
        calls = (message.get("tool_calls") or ()) if role == "assistant" else ()
        if not calls:
            return False
        ids = [call.get("id") for call in calls]
        if all(i is not None for i in ids):
            return not set(ids) <= answered
        return count < len(calls)
    return False


def insert_errata(
    messages: Sequence[Mapping[str, Any]], errata: Iterable[Erratum]
) -> tuple[list[dict[str, Any]], list[int]]:
    """``messages`` with each anchored erratum after its anchor, and each message's new index.

    Errata at one anchor keep their issue order (``seq``); unanchored ones and those whose anchor
    is past the end (the agent shortened its history) are left out.
    """
    by_anchor: dict[int, list[Erratum]] = {}
    for erratum in errata:
        if erratum.anchor is not None and 0 <= erratum.anchor < len(messages):
            by_anchor.setdefault(erratum.anchor, []).append(erratum)
    out: list[dict[str, Any]] = []
    positions: list[int] = []
    for i, message in enumerate(messages):
        positions.append(len(out))
        out.append(dict(message))
        for erratum in sorted(by_anchor.get(i, ()), key=lambda e: e.seq):
            out.append(erratum.message())
    return out, positions
