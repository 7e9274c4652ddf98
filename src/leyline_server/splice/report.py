"""What a splice reports: the fallback (the wire's :class:`~leyline_sdk.core.wire.FallbackInfo`, its codes
:mod:`leyline_sdk.core.fallbacks`), the report, the strict-mode error."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import FallbackInfo

__all__ = ["FallbackCode", "FallbackInfo", "SpliceReport", "SpliceError", "Refused", "strict_status"]


class SpliceReport(BaseModel):
    """What a splice did: counts of reused, rotated and prefilled tokens, the canary, time, fallback."""

    applied: bool
    fallback: FallbackInfo | None = None
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    canary: Literal["passed", "skipped", "unavailable"] = "skipped"
    splice_ms: float = 0.0
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
