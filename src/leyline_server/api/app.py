"""The ASGI app: routers, the request middleware (limits, request ids, metrics, errors), system routes.

Routes: ``POST /v1/chat/completions`` (:mod:`chat_routes`), ``/v1/leyline/*``
(:mod:`leyline_routes`), ``GET /v1/models[/{id}]``, ``GET /health``, ``GET /metrics``. Every error,
expected or not, is answered in OpenAI's JSON shape with an ``x-request-id`` header; an
unexpected one is logged with that id and the server keeps serving.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from leyline_server.api import blocks_routes, chat_routes, leyline_routes
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import error_body, install_error_handlers
from leyline_server.api.service import LeylineService

__all__ = ["create_app"]

log = logging.getLogger("leyline.api")


def _system_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(service: Service) -> dict[str, Any]:
        info = service.engine.info
        return {
            "status": "ok",
            "model": service.config.names[0],
            "engine": info.engine,
            "sessions": len(service.sessions),
        }

    @app.get("/metrics")
    async def prometheus(service: Service) -> Response:
        service.metrics.sessions.set(len(service.sessions))
        service.metrics.sessions_dropped.set(service.sessions.dropped)
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(_: Owner, service: Service) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(service, name) for name in service.config.names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, _: Owner, service: Service) -> dict[str, Any]:
        service.check_model(model_id)
        return _model_card(service, model_id)


def _model_card(service: LeylineService, name: str) -> dict[str, Any]:
    """OpenAI's model object, with SGLang's ``max_model_len``."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "leyline", "max_model_len": service.context_tokens}


def _middleware(app: FastAPI, service: LeylineService) -> None:
    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        request_id = "req-" + secrets.token_hex(8)
        length = request.headers.get("content-length")
        limit = service.config.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            response: Response = JSONResponse(
                error_body(413, "body_too_large", f"request body over {limit} bytes"), status_code=413
            )
        else:
            try:
                response = await call_next(request)
            except Exception:  # a bug, not the client's fault: say so in OpenAI's shape, keep serving
                log.exception("request %s %s %s failed", request_id, request.method, request.url.path)
                message = f"internal server error (request id {request_id})"
                response = JSONResponse(error_body(500, "internal_error", message), status_code=500)
        response.headers["x-request-id"] = request_id
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service.metrics.requests.labels(path, str(response.status_code)).inc()
        service.metrics.latency.labels(path).observe(time.perf_counter() - started)
        return response


def create_app(service: LeylineService) -> FastAPI:
    """The ASGI app serving ``service``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await service.shutdown()

    app = FastAPI(title="Leyline", version="0.2.0", lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    _middleware(app, service)
    _system_routes(app)
    app.include_router(chat_routes.router)
    app.include_router(leyline_routes.router)
    app.include_router(blocks_routes.router)
    return app
