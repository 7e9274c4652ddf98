"""What a splice reports: stable fallback codes, the report, and the strict-mode error."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel

__all__ = ["FallbackCode", "Fallback", "SpliceReport", "SpliceError", "Refused", "strict_status"]


class FallbackCode(str, Enum):
    """Why a splice was not applied as asked (stable, reported to clients)."""

    BASE_MISMATCH = "base_mismatch"
    SPAN_INVALID = "span_invalid"
    TOKEN_INVALID = "token_invalid"
    PROMPT_MISMATCH = "prompt_mismatch"
    ROPE_UNSUPPORTED = "rope_unsupported"
    DRIFT_BUDGET = "drift_budget"
    CANARY_FAILED = "canary_failed"
    CAPACITY = "capacity"
    CONTEXT_LENGTH = "context_length_exceeded"


class Fallback(BaseModel):
    """A fallback code with a human-readable message."""

    code: FallbackCode
    message: str


class SpliceReport(BaseModel):
    """What a splice did: counts of reused, rotated and prefilled tokens, the canary, time, fallback."""

    applied: bool
    fallback: Fallback | None = None
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    canary: Literal["passed", "skipped", "unavailable"] = "skipped"
    splice_ms: float = 0.0


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
