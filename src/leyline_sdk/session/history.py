"""The agent's conversation as a session keeps it: :class:`History`.

Two histories, never confused: the **full** one the agent wrote (Leyline never changes it:
nothing is lost) and the **effective** one the model sees (after the policies). Policy edits are
*sticky*: once a message is evicted it renders the same way every later turn, so an edit is paid
once. ``block_prints`` are the messages registered as block messages
(:meth:`History.add_block_message`).

The agent may edit its own history too (clear an old tool result, trim old messages,
summarise): :meth:`History.adopt` takes the new full history and carries each sticky edit over to
the message it was made on, where that message is still there unchanged; an edit of a message the
agent changed or removed itself is dropped (the agent's own edit governs it now).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from leyline_sdk.core.directives import Mode
from leyline_sdk.core.validation import check_messages
from leyline_sdk.policy.edits import Edit
from leyline_sdk.policy.run import EditReport, run_policies
from leyline_sdk.session.blocks import block_fingerprint, strip_block_marks

__all__ = ["History", "PolicyPass"]


@dataclass(frozen=True)
class PolicyPass:
    """One run of the policies: the effective messages, each edited one's mode (by effective index),
    the report, and which effective messages are block messages."""

    effective: list[dict[str, Any]]
    modes: dict[int, Mode]
    report: EditReport
    block_indices: set[int]


@dataclass
class History:
    """The full history, the effective one, the sticky edits and the registered block messages."""

    full: list[dict[str, Any]] = field(default_factory=list)
    effective: list[dict[str, Any]] = field(default_factory=list)
    sticky: dict[int, Edit] = field(default_factory=dict)
    block_prints: set[str] = field(default_factory=set)

    def adopt(self, messages: list[dict[str, Any]]) -> None:
        """The agent's new full history; sticky edits follow their messages (see the module docstring)."""
        old, self.full = self.full, messages
        if not self.sticky or (len(messages) >= len(old) and messages[: len(old)] == old):
            return  # an extension: every index still names the same message
        moved = _moved(old, messages)
        sticky: dict[int, Edit] = {}
        for i, edit in self.sticky.items():
            if i not in moved:
                continue  # the agent changed or removed that message itself
            sticky[moved[i]] = _reindexed(edit, moved[i], moved, len(messages))
        self.sticky = sticky

    def apply_policies(self, policies: Sequence[Any], tools: Sequence[Mapping[str, Any]] | None) -> PolicyPass:
        """Run ``policies`` over the full history (sticky edits first); keep and return the result."""
        effective, edits, report = run_policies(self.full, policies, tools, sticky=self.sticky)
        self.sticky = edits
        effective, block_indices = strip_block_marks(effective, self.block_prints)
        self.effective = effective
        return PolicyPass(effective, report.modes(), report, block_indices)  # errata shift later messages

    def add_block_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Append ``message`` as a block message (any message equal to it is one from now on)."""
        (clean,) = strip_block_marks(check_messages([message]))[0]
        self.block_prints.add(block_fingerprint(clean))
        self.full.append(clean)
        return clean


def _key(message: Mapping[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)


def _moved(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Old index -> new index of every message the agent kept unchanged (a message diff)."""
    matcher = SequenceMatcher(None, [_key(m) for m in old], [_key(m) for m in new], autojunk=False)
    out: dict[int, int] = {}
    for a, b, size in matcher.get_matching_blocks():
        out.update({a + k: b + k for k in range(size)})
    return out


def _reindexed(edit: Edit, index: int, moved: Mapping[int, int], length: int) -> Edit:
    """``edit`` on message ``index`` now; its erratum after the kept message nearest its old anchor."""
    note = edit.erratum
    if note is not None and note.anchor is not None:
        kept = [moved[a] for a in moved if a <= note.anchor]
        note = dataclasses.replace(note, anchor=max(kept) if kept else min(index, length - 1))
    return dataclasses.replace(edit, index=index, erratum=note)
