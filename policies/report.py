"""Running policies over a conversation and reporting what each turn cleared."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from leyline_policies.base import Conversation, Edit, Mode, Policy, apply_edits
from leyline_policies.chain import Chain

__all__ = ["ClearedItem", "EditReport", "run_policies"]


class ClearedItem(BaseModel):
    """One message a policy edited."""

    index: int
    policy: str
    reason: str
    mode: Mode
    removed_chars: int


class EditReport(BaseModel):
    """What the policies changed this turn (new edits only; earlier, sticky ones are not repeated)."""

    cleared: list[ClearedItem] = []

    @property
    def removed_chars(self) -> int:
        """Characters removed by this turn's new edits."""
        return sum(c.removed_chars for c in self.cleared)


def run_policies(
    messages: Sequence[Mapping[str, Any]],
    policies: Sequence[Policy | Callable[[Conversation], list[Edit]]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    sticky: Mapping[int, Edit] | None = None,
) -> tuple[list[dict[str, Any]], dict[int, Edit], EditReport]:
    """Apply ``sticky`` edits, then the policies; return (effective messages, all edits, report).

    ``sticky`` edits (from earlier turns) are re-applied first, so an evicted message keeps
    rendering byte for byte the same way; new edits are added to them.
    """
    sticky = dict(sticky or {})
    base = apply_edits(messages, list(sticky.values()))
    proposed = Chain(*policies).propose(Conversation.of(base, tools)) if policies else []
    edits = dict(sticky)
    report = EditReport()
    for e in proposed:
        if e.index in sticky and sticky[e.index].replacement == e.replacement:
            continue
        edits[e.index] = e
        report.cleared.append(
            ClearedItem(index=e.index, policy=e.policy, reason=e.reason, mode=e.mode, removed_chars=e.removed_chars)
        )
    return apply_edits(messages, list(edits.values())), edits, report
