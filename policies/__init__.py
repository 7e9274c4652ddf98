"""Leyline policies: decide which messages to stub or redact; they know nothing of tokens or KV.

``Mode`` is re-exported from ``leyline_sdk.directives`` (the one definition).
"""

from leyline_policies.base import (
    Conversation,
    Edit,
    FunctionPolicy,
    Mode,
    Policy,
    PolicyBase,
    apply_edits,
    as_policy,
)
from leyline_policies.budget import TokenBudget
from leyline_policies.chain import Chain
from leyline_policies.redact import Redact
from leyline_policies.registry import available_policies, load_policy, register
from leyline_policies.report import EditReport, run_policies
from leyline_policies.stale import StaleToolDetector
from leyline_policies.truncate import TruncateOlderThanN

__all__ = [
    "Conversation",
    "Edit",
    "Mode",
    "Policy",
    "PolicyBase",
    "FunctionPolicy",
    "as_policy",
    "apply_edits",
    "TruncateOlderThanN",
    "StaleToolDetector",
    "TokenBudget",
    "Redact",
    "Chain",
    "register",
    "load_policy",
    "available_policies",
    "EditReport",
    "run_policies",
]
