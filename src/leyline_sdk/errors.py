"""Exceptions raised by the Leyline SDK.

Hierarchy::

    LeylineError
     ├── DirectiveError (also a ValueError)     directives that cannot apply to a base
     ├── RenderError    (also a ValueError)     a conversation the chat template cannot render
     ├── SpliceFallbackError                    strict session: the edit could not be spliced as asked
     ├── APIConnectionError                     the server could not be reached (after retries)
     └── APIStatusError                         the server answered with an error status
          ├── BadRequestError            400
          ├── AuthenticationError        401
          ├── NotFoundError              404
          ├── ConflictError              409   (base mismatch, strict)
          ├── UnprocessableEntityError   422   (directive not applicable, strict)
          ├── RateLimitError             429
          └── InternalServerError        5xx
"""

from __future__ import annotations

from typing import Any


class LeylineError(Exception):
    """Base class of every error the SDK raises on purpose."""


class DirectiveError(LeylineError, ValueError):
    """A directive set does not apply to its base.

    ``index`` is the offending directive's position in the list (``None`` when the error is
    about the whole set) and ``field`` the field at fault (``start``, ``end``, ``base_length``).
    """

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


class RenderError(LeylineError, ValueError):
    """The chat template could not render a conversation (bad roles, missing fields, ...)."""


class SpliceFallbackError(LeylineError):
    """A strict session's edit was not applied as asked; ``code`` is the fallback code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class APIConnectionError(LeylineError):
    """The request never got an HTTP answer (connection refused, reset, timeout)."""


class APIStatusError(LeylineError):
    """An error response; ``status_code``, ``code`` and ``body`` come from the server."""

    def __init__(self, status_code: int, body: Any, retry_after: float | None = None) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status_code = status_code
        self.body = body
        self.code = error.get("code") if isinstance(error, dict) else None
        self.retry_after = retry_after
        message = error.get("message") if isinstance(error, dict) else None
        super().__init__(f"HTTP {status_code}: {message or body}")


class BadRequestError(APIStatusError):
    """400."""


class AuthenticationError(APIStatusError):
    """401."""


class NotFoundError(APIStatusError):
    """404."""


class ConflictError(APIStatusError):
    """409: the client's base differs from the server's (strict)."""


class UnprocessableEntityError(APIStatusError):
    """422: a directive could not be applied (strict)."""


class RateLimitError(APIStatusError):
    """429."""


class InternalServerError(APIStatusError):
    """5xx."""


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(status_code: int, body: Any, retry_after: float | None = None) -> APIStatusError:
    """The typed exception for an error status."""
    cls = _BY_STATUS.get(status_code) or (InternalServerError if status_code >= 500 else APIStatusError)
    return cls(status_code, body, retry_after)
