"""Splicing: the pure plan, its executor over any engine, and the report with its fallback codes."""

from leyline_server.contract.report import FallbackCode, FallbackInfo, SpliceError, SpliceReport, strict_status
from leyline_server.splice.execute import settle_forget, splice, splice_for_turn, validate
from leyline_server.splice.plan import Fill, SplicePlan, plan_splice

__all__ = [
    "FallbackInfo",
    "FallbackCode",
    "Fill",
    "SpliceError",
    "SpliceReport",
    "SplicePlan",
    "plan_splice",
    "settle_forget",
    "splice",
    "splice_for_turn",
    "strict_status",
    "validate",
]
