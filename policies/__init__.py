"""Leyline policies: decide which messages to stub, redact or correct; they know nothing of tokens or KV.

``Mode`` is re-exported from ``leyline_sdk.core.directives`` (the one definition). An ``Edit`` says
what kind of change it is (``EditKind``: evict, redact, correct); a ``correct`` edit may carry
an ``Erratum``, a correction message appended at the end instead of rewriting history.
"""

from leyline_policies.base import (
    Conversation,
    Edit,
    EditKind,
    FunctionPolicy,
    Mode,
    Policy,
    PolicyBase,
    apply_edits,
    as_policy,
    correct_field,
    merge_edits,
)
from leyline_policies.budget import TokenBudget
from leyline_policies.chain import Chain
from leyline_policies.errata import ERRATUM_MARKER, Erratum, insert_errata, pending_tool_calls
from leyline_policies.redact import Redact
from leyline_policies.registry import available_policies, load_policy, register
from leyline_policies.report import EditReport, run_policies
from leyline_policies.stale import StaleToolDetector
from leyline_policies.thinking import ClearThinking
from leyline_policies.truncate import TruncateOlderThanN

__all__ = [
    "Conversation",
    "Edit",
    "EditKind",
    "Erratum",
    "ERRATUM_MARKER",
    "Mode",
    "Policy",
    "PolicyBase",
    "FunctionPolicy",
    "as_policy",
    "apply_edits",
    "merge_edits",
    "correct_field",
    "insert_errata",
    "pending_tool_calls",
    "TruncateOlderThanN",
    "StaleToolDetector",
    "ClearThinking",
    "TokenBudget",
    "Redact",
    "Chain",
    "register",
    "load_policy",
    "available_policies",
    "EditReport",
    "run_policies",
]
