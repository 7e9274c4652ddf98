"""HTTP transport of the SDK: httpx, tenacity retries, typed errors, SSE decoding.

Retries (tenacity ``AsyncRetrying``): connection errors, 429 (honouring ``Retry-After``) and
5xx, with exponential backoff and jitter; never other 4xx. Every call carries one idempotency
key across its retries. ``iter_sse`` is a pure function over text lines.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from leyline_sdk.errors import APIConnectionError, APIStatusError, InternalServerError, RateLimitError, status_error

__all__ = ["Transport", "iter_sse", "is_retryable"]


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Decode Server-Sent Events ``data:`` payloads (JSON) until ``[DONE]``."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return
            yield json.loads(payload)
    if data and data != ["[DONE]"]:
        yield json.loads("\n".join(data))


def is_retryable(exc: BaseException) -> bool:
    """Connection errors, 429 and 5xx."""
    return isinstance(exc, APIConnectionError | RateLimitError | InternalServerError)


_BACKOFF = wait_exponential(multiplier=0.25, max=8.0) + wait_random(0, 0.25)  # backoff with jitter


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, APIStatusError) and exc.retry_after is not None:
        return min(exc.retry_after, 60.0)
    return _BACKOFF(state)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Transport:
    """One base URL, one API key, one httpx client."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 2,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.max_retries = max_retries
        self._client = http_client or httpx.AsyncClient(timeout=timeout)

    def _headers(self, idempotency_key: str) -> dict[str, str]:
        headers = {"Idempotency-Key": idempotency_key, "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=_wait,
            retry=retry_if_exception(is_retryable),
            reraise=True,
        )

    async def _send(self, method: str, path: str, body: Any, key: str, stream: bool) -> httpx.Response:
        try:
            request = self._client.build_request(method, self.base_url + path, json=body, headers=self._headers(key))
            response = await self._client.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise APIConnectionError(f"{method} {path}: {exc!r}") from exc
        if response.status_code >= 400:
            raw = await response.aread()
            try:
                payload: Any = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            raise status_error(response.status_code, payload, _retry_after(response))
        return response

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send and decode a JSON response, retrying what is retryable."""
        key = uuid.uuid4().hex
        async for attempt in self._retrying():
            with attempt:
                response = await self._send(method, path, body, key, stream=False)
        return response.json()

    async def stream(self, path: str, body: Any) -> AsyncIterator[dict[str, Any]]:
        """POST and yield the SSE payloads (retries only until the stream has started)."""
        key = uuid.uuid4().hex
        async for attempt in self._retrying():
            with attempt:
                response = await self._send("POST", path, body, key, stream=True)
        try:
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line == "":
                    for event in iter_sse(lines):
                        yield event
                    if lines and lines[-2:-1] == ["data: [DONE]"]:
                        return
                    lines = []
            for event in iter_sse(lines + [""]):
                yield event
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the underlying httpx client."""
        await self._client.aclose()
