"""The ASGI guard in front of every route: a request's work is bounded before a route sees it.

For each HTTP request, in this order:

1. an ``x-request-id`` is made (every response carries it);
2. on ``/v1/...`` the API key is checked from the raw ``Authorization`` (or, as Anthropic's
   clients send it, ``x-api-key``) bytes *before a byte of the body is read* (a key with
   non-ASCII bytes is just a wrong key: 401); the key becomes the request's owner (:func:`owner_of`);
3. the body is read up to ``max_body_bytes``, counting the bytes actually received —
   ``Content-Length`` and chunked bodies alike: past the limit the answer is 413 and the rest
   is never read;
4. a JSON body holding a lone UTF-16 surrogate (``"a\\ud800b"``: no UTF-8 text can carry it, so
   no tokenizer can) is refused with a 400 naming the field;
5. the route runs on the buffered body; an exception it lets out before answering becomes a
   logged 500 in OpenAI's shape with the request id, and the server keeps serving;
6. the request is counted in ``leyline_requests_total`` under its status — a stream that failed
   after its 200 under the status of its error (:func:`~leyline_server.api.streaming.stream_failed`).

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): ``receive`` is wrapped, so a
stream still sees the client's disconnect.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from leyline_server.api.config import ServerConfig
from leyline_server.api.errors import error_body
from leyline_server.api.metrics import Metrics
from leyline_server.api.streaming import STREAM_STATUS

__all__ = ["Guard", "owner_of", "lone_surrogate"]

log = logging.getLogger("leyline.api")
OWNER = "leyline.owner"  # the scope-state entry holding the authenticated key
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")  # after json.loads, a valid pair is one astral character


def owner_of(scope: Scope) -> tuple[bool, str | None]:
    """(authenticated, the caller's key) as the guard recorded it (``None``: no keys configured)."""
    state = scope.get("state") or {}
    return OWNER in state, state.get(OWNER)


def lone_surrogate(body: bytes) -> str | None:
    """The path (``messages.0.content``) of the first string holding a lone surrogate, else ``None``.

    Only a body that could hold one is parsed: one with a ``\\uD800``–``\\uDFFF`` escape, or one
    that is not UTF-8 (Python's JSON parser decodes such bytes as UTF-16/32 or with
    ``surrogatepass``). Malformed JSON is left to the route's own parser (which answers 400).
    """
    if not _SURROGATE_ESCAPE.search(body):
        try:
            body.decode("utf-8")
            return None  # valid UTF-8 cannot encode a surrogate
        except UnicodeDecodeError:
            pass
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if _SURROGATE.search(key):
                    return where
                stack.append((item, where))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value))
    return None


_KEY_MISSING = "missing or invalid API key (Authorization: Bearer KEY, or x-api-key: KEY)"


def _refusal(status: int, code: str, message: str, param: str | None = None, path: str = "") -> JSONResponse:
    return JSONResponse(error_body(status, code, message, param, path), status_code=status)


class _Disconnected(Exception):
    """The client went away while sending its body."""


class Guard:
    """The middleware; see the module docstring."""

    def __init__(self, app: ASGIApp, config: ServerConfig, metrics: Metrics) -> None:
        self.app, self.config, self.metrics = app, config, metrics
        self._keys = [(k, k.encode("utf-8")) for k in sorted(config.api_keys)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = "req-" + secrets.token_hex(8)
        response: dict[str, Any] = {"status": 500, "started": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"], response["started"] = message["status"], True
                rid = request_id.encode()
                ids = [(b"x-request-id", rid), (b"request-id", rid)]  # OpenAI's name, Anthropic's
                message = {**message, "headers": [*message.get("headers", []), *ids]}
            await send(message)

        try:
            await self._handle(scope, receive, send_with_id)
        except _Disconnected:
            response["status"] = 499
        except Exception:
            if response["started"]:
                raise  # a stream already answered 200: the server ends the connection
            log.exception("request %s %s %s failed", request_id, scope.get("method"), scope.get("path"))
            message = f"internal server error (request id {request_id})"
            await _refusal(500, "internal_error", message, path=scope.get("path", ""))(scope, receive, send_with_id)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            status = (scope.get("state") or {}).get(STREAM_STATUS, response["status"])  # a stream that failed
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - started)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._authenticate(scope)
        body = b""
        if refusal is None:
            body, refusal = await self._read_body(scope, receive)
        if refusal is None:
            where = lone_surrogate(body)
            if where is not None:
                where = where.encode("utf-8", "backslashreplace").decode()  # a key may hold it too
                message = f"{where}: a lone UTF-16 surrogate is not text (no UTF-8 encoding exists)"
                refusal = _refusal(400, "invalid_request", message, where, scope.get("path", ""))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _authenticate(self, scope: Scope) -> JSONResponse | None:
        """Record the caller's key; a 401 for a protected path without a valid one."""
        state = scope.setdefault("state", {})
        if not self._keys:
            state[OWNER] = None
            return None
        headers = scope.get("headers", [])
        header = next((v for k, v in headers if k == b"authorization"), b"")
        tokens = [header[7:].strip() if header[:7].lower() == b"bearer " else b""]
        tokens += [v.strip() for k, v in headers if k == b"x-api-key"]  # Anthropic's clients send this one
        for key, raw in self._keys:
            if any(hmac.compare_digest(token, raw) for token in tokens):
                state[OWNER] = key
                return None
        path = str(scope.get("path", ""))
        if not path.startswith("/v1/"):
            return None  # /health, /metrics, the OpenAPI schema: open
        return _refusal(401, "invalid_api_key", _KEY_MISSING, path=path)

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, JSONResponse | None]:
        """The whole body, or a 413 as soon as more than the limit arrived (the rest is not read)."""
        limit = self.config.max_body_bytes
        too_large = _refusal(413, "body_too_large", f"request body over {limit} bytes", path=scope.get("path", ""))
        length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > limit:
            return b"", too_large
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """A ``receive`` that hands the buffered body over once, then the client's own events."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
