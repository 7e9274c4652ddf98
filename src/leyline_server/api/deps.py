"""Request dependencies shared by the routers: the service and the caller's API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from leyline_server.api.errors import APIError
from leyline_server.api.guard import owner_of
from leyline_server.api.pipeline import ChatPipeline
from leyline_server.api.service import LeylineService

__all__ = ["get_service", "get_pipeline", "owner", "Owner", "Service", "Pipeline", "ClientEdits"]


def get_service(request: Request) -> LeylineService:
    """The app's :class:`LeylineService`."""
    service: LeylineService = request.app.state.service
    return service


def get_pipeline(request: Request) -> ChatPipeline:
    """The app's :class:`ChatPipeline` (the one chat turn every protocol's route runs)."""
    pipeline: ChatPipeline = request.app.state.pipeline
    return pipeline


_KEY_MISSING = "missing or invalid API key (Authorization: Bearer KEY, or x-api-key: KEY)"


async def owner(request: Request) -> str | None:
    """The caller's API key as :class:`~leyline_server.api.guard.Guard` authenticated it (``None``
    when the server has no keys); 401 if it did not (it answers before the body is read)."""
    authenticated, key = owner_of(request.scope)
    if not authenticated:
        raise APIError(401, "invalid_api_key", _KEY_MISSING)
    return key


Service = Annotated[LeylineService, Depends(get_service)]  # the app's service, as a parameter type
Pipeline = Annotated[ChatPipeline, Depends(get_pipeline)]  # the app's chat pipeline, as a parameter type
Owner = Annotated[str | None, Depends(owner)]  # the caller's API key, as a parameter type
# the X-Leyline-Client-Edits header (api.conversations): how a plain client's own edits are served
ClientEdits = Annotated[str | None, Header(alias="x-leyline-client-edits", include_in_schema=False)]
