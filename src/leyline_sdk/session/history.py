"""The agent's conversation as a session keeps it: :class:`History`.

Two histories, never confused: the **full** one the agent wrote (Leyline never changes it:
nothing is lost) and the **effective** one the model sees (after the policies). Policy edits are
*sticky*: once a message is evicted it renders the same way every later turn, so an edit is paid
once. ``block_prints`` are the messages registered as block messages
(:meth:`History.add_block_message`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
