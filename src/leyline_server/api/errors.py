"""API errors in OpenAI's shape: ``{"error": {"type", "code", "message", "param"}}``.

Status codes: 400 malformed request or unsupported parameter, 401 authentication, 404 unknown
model or session, 409 base mismatch (strict), 413 body too large, 422 directive not applicable
(strict), 429 the key is at its share (with ``Retry-After``), 500 a server bug (with a request
id), 503 no KV capacity.

A 409 carries ``x-should-retry: false``: openai-python's clients retry 409 as a lock timeout,
but a base mismatch is an answer, not a transient state, and the same request meets it again.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["APIError", "install_error_handlers", "error_body", "invalid", "MESSAGES_PREFIX"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "unprocessable_entity_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and OpenAI's error body."""

    def __init__(
        self, status: int, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}


# Anthropic's error types by status (the Messages API's routes answer in its shape)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
MESSAGES_PREFIX = "/v1/messages"


def error_body(status: int, code: str, message: str, param: str | None = None, path: str = "") -> dict[str, Any]:
    """The JSON body of an error response: OpenAI's shape, or Anthropic's on the Messages API's
    routes (``{"type": "error", "error": {"type", "message"}}``, the message naming the field)."""
    if path.startswith(MESSAGES_PREFIX):
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        named = f"{param}: {message}" if param and not message.startswith(param) else message
        return {"type": "error", "error": {"type": kind, "message": named, "code": code}}
    return {
        "error": {"type": _TYPES.get(status, "invalid_request_error"), "code": code, "message": message, "param": param}
    }


def invalid(exc: ValidationError) -> APIError:
    """A request a route builds from the client's fields that pydantic refuses: a 400 naming the field."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid_request", "invalid request")
    where = ".".join(str(x) for x in errors[0]["loc"]) or None
    message = errors[0]["msg"]
    return APIError(400, "invalid_request", f"{where}: {message}" if where else message, where)


def _validation_param(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", None
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unrecognized request argument"
    return f"{param + ': ' if param else ''}{message}", param


def install_error_handlers(app: Any) -> None:
    """Map APIError, validation errors and HTTP errors to OpenAI-shaped JSON."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        body = error_body(exc.status, exc.code, exc.message, exc.param, request.url.path)
        headers = {"x-should-retry": "false", **exc.headers} if exc.status == 409 else exc.headers
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_param(exc)
        return JSONResponse(error_body(400, "invalid_request", message, param, request.url.path), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = error_body(exc.status_code, "http_error", str(exc.detail), path=request.url.path)
        return JSONResponse(body, status_code=exc.status_code)
