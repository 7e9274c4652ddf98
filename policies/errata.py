"""Errata: corrections appended to the conversation instead of rewriting it (see ``leyline_sdk.policy.errata``)."""

from leyline_sdk.policy.errata import ERRATUM_MARKER, Erratum, insert_errata, pending_tool_calls

__all__ = ["ERRATUM_MARKER", "Erratum", "insert_errata", "pending_tool_calls"]
