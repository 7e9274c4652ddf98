"""What a splice reports: the fallback (the wire's :class:`~leyline_sdk.core.wire.FallbackInfo`, its codes
:mod:`leyline_sdk.core.fallbacks`), the report, the strict-mode error."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import FallbackInfo, SpliceCounts

__all__ = ["FallbackCode", "FallbackInfo", "SpliceReport", "SpliceError", "Refused", "strict_status"]


class SpliceReport(SpliceCounts):
    """What a splice did: the wire's counts (reused, rotated, prefilled tokens, the canary, time,
    fallback), with ``applied`` always stated and the canary's three values spelled out."""

    model_config = ConfigDict(extra="forbid")

    applied: bool
    canary: Literal["passed", "skipped", "unavailable"] = "skipped"
    # a forget left to the turn's prefill (``splice_for_turn``): the counts are settled after it
    deferred: bool = Field(default=False, exclude=True)


class SpliceError(Exception):
    """Raised instead of falling back when the request is strict."""

    def __init__(self, code: FallbackCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class Refused(Exception):
    """A validation or execution step refused the splice (becomes a fallback or a SpliceError)."""

    def __init__(self, code: FallbackCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def strict_status(code: FallbackCode) -> int:
    """The HTTP status of a strict splice error: 409 base mismatch, 503 capacity, else 422."""
    if code is FallbackCode.BASE_MISMATCH:
        return 409
    if code is FallbackCode.CAPACITY:
        return 503
    return 422
