"""Running policies over a conversation and reporting what each turn cleared (what sessions call)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from leyline_sdk.core.directives import Mode
from leyline_sdk.policy.contracts import Chain, Policy
from leyline_sdk.policy.edits import Conversation, Edit, EditKind, apply_edits, merge_edits
from leyline_sdk.policy.errata import insert_errata, pending_tool_calls

__all__ = ["ClearedItem", "EditReport", "run_policies"]


class ClearedItem(BaseModel):
    """One message a policy edited (``index`` in the full history, ``effective_index`` in what the model sees)."""

    index: int
    policy: str
    reason: str
    mode: Mode
    removed_chars: int
    kind: EditKind = EditKind.EVICT
    erratum: str | None = None
    effective_index: int | None = None


class EditReport(BaseModel):
    """What the policies changed this turn (new edits only; earlier, sticky ones are not repeated)."""

    cleared: list[ClearedItem] = []

    @property
    def removed_chars(self) -> int:
        """Characters removed by this turn's new edits."""
        return sum(c.removed_chars for c in self.cleared)

    @property
    def errata(self) -> list[str]:
        """The texts of the errata issued this turn."""
        return [c.erratum for c in self.cleared if c.erratum is not None]

    def modes(self) -> dict[int, Mode]:
        """Each edited message's mode, by its index in the *effective* messages (errata shift them)."""
        return {c.index if c.effective_index is None else c.effective_index: c.mode for c in self.cleared}


def _anchored(edit: Edit, anchor: int, seq: int) -> Edit:
    assert edit.erratum is not None
    return dataclasses.replace(edit, erratum=dataclasses.replace(edit.erratum, anchor=anchor, seq=seq))


def _item(edit: Edit, earlier: Edit | None) -> ClearedItem:
    """The report line of ``edit``: only what is new since ``earlier`` (content, erratum) counts."""
    new_content = edit.replacement is not None and (earlier is None or edit.replacement != earlier.replacement)
    new_erratum = edit.erratum is not None and (earlier is None or earlier.erratum is None)
    return ClearedItem(
        index=edit.index,
        policy=edit.policy,
        reason=edit.reason,
        mode=edit.mode,
        removed_chars=edit.removed_chars if new_content else 0,
        kind=edit.kind,
        erratum=edit.erratum.text if new_erratum and edit.erratum is not None else None,
    )


def run_policies(
    messages: Sequence[Mapping[str, Any]],
    policies: Sequence[Policy | Callable[[Conversation], list[Edit]]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    sticky: Mapping[int, Edit] | None = None,
) -> tuple[list[dict[str, Any]], dict[int, Edit], EditReport]:
    """Apply ``sticky`` edits, then the policies; return (effective messages, all edits, report).

    ``sticky`` edits (from earlier turns) are re-applied first, so an evicted message keeps
    rendering byte for byte the same way; new edits are merged into them
    (:func:`~leyline_sdk.policy.edits.merge_edits`: an erratum once issued never changes). A new
    erratum is anchored after the last message, unless the history ends inside a tool exchange
    (then the edit that carries it waits for a later turn). The effective messages have every
    anchored erratum inserted after its anchor; the report gives each cleared message's
    ``effective_index``.
    """
    sticky = dict(sticky or {})
    base = apply_edits(messages, list(sticky.values()))
    proposed = Chain(*policies).propose(Conversation.of(base, tools)) if policies else []
    edits = dict(sticky)
    report = EditReport()
    seq = max((e.erratum.seq for e in sticky.values() if e.erratum is not None), default=0)
    ready = bool(messages) and not pending_tool_calls(messages)
    for e in proposed:
        earlier = sticky.get(e.index)
        merged = merge_edits(earlier, e, keep_forget=False) if earlier is not None else e
        if merged.erratum is not None and merged.erratum.anchor is None:
            if not ready:
                continue  # never inside a tool exchange; proposed again next turn
            seq += 1
            merged = _anchored(merged, len(messages) - 1, seq)
        if merged == earlier:
            continue
        edits[e.index] = merged
        report.cleared.append(_item(merged, earlier))
    errata = [e.erratum for e in edits.values() if e.erratum is not None]
    effective, positions = insert_errata(apply_edits(messages, list(edits.values())), errata)
    for item in report.cleared:
        item.effective_index = positions[item.index] if item.index < len(positions) else None
    return effective, edits, report
