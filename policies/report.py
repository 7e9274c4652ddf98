"""Running policies and reporting what each turn cleared (defined in ``leyline_sdk.policy.run``)."""

from leyline_sdk.policy.run import ClearedItem, EditReport, run_policies

__all__ = ["ClearedItem", "EditReport", "run_policies"]
