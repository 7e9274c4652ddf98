"""FastAPI routes: thin wrappers over :class:`LeylineService`.

``POST /v1/chat/completions`` (OpenAI, SSE or not, with the ``leyline`` extension),
``POST /v1/leyline/tokenize``, ``POST/GET/DELETE /v1/leyline/sessions[/{id}]``,
``POST /v1/leyline/sessions/{id}/directives``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from leyline_server.api.errors import APIError, error_body, install_error_handlers
from leyline_server.api.schemas import ChatCompletionRequest, DirectivesRequest, SessionCreateRequest, TokenizeRequest
from leyline_server.api.service import LeylineService
from leyline_server.api.toolcalls import parse_tool_calls
from leyline_server.sessions import Session

__all__ = ["create_app"]

TOOL_MARK = "<tool_call>"


def _session_json(session: Session, with_tokens: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": session.id,
        "object": "leyline.session",
        "base": {"length": len(session.tokens), "digest": session.digest},
    }
    if with_tokens:
        body["tokens"] = list(session.tokens)
    return body


class _Decoder:
    """Incremental detokenization that never emits a half UTF-8 character or a stop string."""

    def __init__(self, tokenizer: Any, eos_ids: list[int], stops: list[str]) -> None:
        self.tokenizer, self.eos_ids, self.stops = tokenizer, set(eos_ids), stops
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False

    def text(self) -> str:
        ids = [t for t in self.ids if t not in self.eos_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0:
                self.stopped = True
                text = text[:at]
        return text

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to show."""
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):
            return ""
        visible = text.split(TOOL_MARK, 1)[0]  # tool calls are sent parsed, at the end
        hold = max((len(s) - 1 for s in self.stops), default=0)
        hold = max(hold, len(TOOL_MARK) - 1)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta

    def rest(self) -> str:
        """Whatever was held back, at the end of generation."""
        visible = self.text().split(TOOL_MARK, 1)[0]
        delta = visible[self.emitted :]
        self.emitted = len(visible)
        return delta


def create_app(service: LeylineService) -> FastAPI:
    """The ASGI app serving ``service``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.shutdown()

    app = FastAPI(title="Leyline", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    config = service.config
    metrics = service.metrics

    @app.middleware("http")
    async def limits_and_metrics(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            response: Response = JSONResponse(
                error_body(413, "body_too_large", f"request body over {config.max_body_bytes} bytes"), status_code=413
            )
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(path, str(response.status_code)).inc()
        metrics.latency.labels(path).observe(time.perf_counter() - started)
        return response

    async def owner(request: Request) -> str | None:
        if not config.api_keys:
            return None
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not any(secrets.compare_digest(key, k) for k in config.api_keys):
            raise APIError(401, "invalid_api_key", "missing or invalid API key (Authorization: Bearer KEY)")
        return key

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": config.model_name, "sessions": len(service.sessions)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(_: str | None = Depends(owner)) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": config.model_name, "object": "model", "created": 0, "owned_by": "leyline"}],
        }

    @app.post("/v1/leyline/tokenize")
    async def tokenize(body: TokenizeRequest, _: str | None = Depends(owner)) -> dict[str, Any]:
        rendered = service.render(body.messages, body.tools, body.add_generation_prompt)
        return {
            "tokens": rendered.tokens,
            "message_spans": [{"start": s.start, "end": s.end} for s in rendered.message_spans],
            "prefix_stable": rendered.prefix_stable,
            "unstable_reason": rendered.unstable_reason,
        }

    @app.post("/v1/leyline/sessions")
    async def create_session(body: SessionCreateRequest, key: str | None = Depends(owner)) -> dict[str, Any]:
        if (body.messages is None) == (body.tokens is None):
            raise APIError(400, "invalid_request", "give exactly one of 'messages' and 'tokens'")
        tokens = (
            body.tokens if body.tokens is not None else service.render(body.messages or [], body.tools, False).tokens
        )
        return _session_json(await service.create_session(key, tokens))

    @app.get("/v1/leyline/sessions/{session_id}")
    async def get_session(session_id: str, key: str | None = Depends(owner)) -> dict[str, Any]:
        return _session_json(service.get_session(session_id, key))

    @app.delete("/v1/leyline/sessions/{session_id}")
    async def delete_session(session_id: str, key: str | None = Depends(owner)) -> dict[str, Any]:
        async with service.lock(session_id):
            if not service.sessions.delete(session_id, key):
                raise APIError(404, "session_not_found", "unknown or expired session", "session_id")
        return {"id": session_id, "object": "leyline.session.deleted", "deleted": True}

    @app.post("/v1/leyline/sessions/{session_id}/directives")
    async def directives(session_id: str, body: DirectivesRequest, key: str | None = Depends(owner)) -> dict[str, Any]:
        async with service.lock(session_id):
            session = service.get_session(session_id, key)
            report = await service.apply_directives(session, body.directives, body.base, body.strict)
            return {
                **_session_json(session, with_tokens=False),
                "applied": report.applied,
                "fallback": report.fallback.model_dump(mode="json") if report.fallback else None,
                "reused_tokens": report.reused_tokens,
                "rotated_tokens": report.rotated_tokens,
                "prefilled_tokens": report.prefilled_tokens,
                "splice_ms": report.splice_ms,
            }

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, key: str | None = Depends(owner)) -> Any:
        session_id = body.leyline.session_id if body.leyline and body.leyline.session_id else None
        lock = service.lock(session_id) if session_id else None
        if lock is not None:
            await lock.acquire()
        try:
            prepared = await service.prepare_chat(body, key)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        params = service.sampling(body)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        decoder = _Decoder(service.tokenizer, service.engine.eos_token_ids, stops)
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())

        def usage() -> dict[str, Any]:
            reused, rotated, _ = prepared.counts()
            n = len(prepared.generated)
            return {
                "prompt_tokens": len(prepared.prompt),
                "completion_tokens": n,
                "total_tokens": len(prepared.prompt) + n,
                "prompt_tokens_details": {"cached_tokens": reused + rotated},
            }

        def finish(reason: str | None, calls: list[dict[str, Any]]) -> str:
            if calls:
                return "tool_calls"
            return "stop" if decoder.stopped else (reason or "stop")

        if not body.stream:
            try:
                reason = None
                async for step in service.generate(prepared, params):
                    decoder.push(step.token)
                    reason = step.finish_reason
                    if decoder.stopped:
                        break
            finally:
                if lock is not None:
                    lock.release()
            content, calls = parse_tool_calls(decoder.text())
            message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
            if calls:
                message["tool_calls"] = calls
            return {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": config.model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish(reason, calls), "logprobs": None}],
                "usage": usage(),
                "leyline": service.leyline_stats(prepared),
            }

        include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))

        def chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> str:
            payload = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": config.model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}],
                **extra,
            }
            return f"data: {json.dumps(payload)}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                yield chunk({"role": "assistant", "content": ""})
                reason = None
                async for step in service.generate(prepared, params):
                    delta = decoder.push(step.token)
                    reason = step.finish_reason
                    if delta:
                        yield chunk({"content": delta})
                    if decoder.stopped:
                        break
                rest = decoder.rest()
                if rest:
                    yield chunk({"content": rest})
                _, calls = parse_tool_calls(decoder.text())
                if calls:
                    yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                yield chunk({}, finish(reason, calls), leyline=service.leyline_stats(prepared))
                if include_usage:
                    payload = {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": config.model_name,
                        "choices": [],
                        "usage": usage(),
                    }
                    yield f"data: {json.dumps(payload)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if lock is not None:
                    lock.release()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
