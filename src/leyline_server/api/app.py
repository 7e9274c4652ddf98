"""The ASGI app: routers, the guard in front of them (:mod:`.guard`), system routes.

Routes: ``POST /v1/chat/completions`` (:mod:`chat_routes`), ``/v1/responses``
(:mod:`.responses_api`), ``/v1/messages`` (:mod:`.messages_api`), ``/v1/leyline/*``
(:mod:`leyline_routes`, :mod:`blocks_routes`), ``GET /v1/models[/{id}]``, ``GET /health``,
``GET /metrics``, ``GET /model_info`` and ``GET /server_info`` (:mod:`info_routes`, for SGLang's
router). Every error, expected or not, is answered in OpenAI's JSON shape (Anthropic's on the
Messages API's routes) with an ``x-request-id`` header; an unexpected one is logged with that id
and the server keeps serving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response

from leyline_server.api import blocks_routes, chat_routes, info_routes, leyline_routes
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import install_error_handlers
from leyline_server.api.guard import Guard
from leyline_server.api.heap import freeze_startup_heap, thaw_startup_heap
from leyline_server.api.messages_api import routes as messages_routes
from leyline_server.api.pipeline import ChatPipeline
from leyline_server.api.responses_api import routes as responses_routes
from leyline_server.api.responses_api.store import ResponseStore
from leyline_server.api.service import LeylineService

__all__ = ["create_app"]


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
        service.metrics.kv_reserved.set(service.admission.reserved)
        service.metrics.retractions.set(getattr(service.engine, "retractions", 0))
        service.metrics.admission_waiting.set(service.admission.waiting)
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


def create_app(service: LeylineService) -> FastAPI:
    """The ASGI app serving ``service``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        freeze_startup_heap()
        try:
            yield
            await service.shutdown()
        finally:
            thaw_startup_heap()

    app = FastAPI(title="Leyline", version="0.2.0", lifespan=lifespan)
    app.state.service = service
    app.state.pipeline = ChatPipeline(service)
    config = service.config
    app.state.responses = ResponseStore(
        config.responses_per_key,
        config.responses_tokens_per_key,
        config.responses_ttl_s,
        max_bytes_per_key=config.responses_bytes_per_key,
    )
    install_error_handlers(app)
    app.add_middleware(Guard, config=service.config, metrics=service.metrics)
    _system_routes(app)
    app.include_router(chat_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(messages_routes.router)
    app.include_router(leyline_routes.router)
    app.include_router(blocks_routes.router)
    app.include_router(info_routes.router)
    return app
