"""Request dependencies shared by the routers: the service and the caller's API key."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request

from leyline_server.api.errors import APIError
from leyline_server.api.service import LeylineService

__all__ = ["get_service", "owner", "Owner", "Service"]


def get_service(request: Request) -> LeylineService:
    """The app's :class:`LeylineService`."""
    service: LeylineService = request.app.state.service
    return service


async def owner(request: Request) -> str | None:
    """The caller's API key (``None`` when the server has no keys); 401 when it is wrong."""
    service = get_service(request)
    keys = service.config.api_keys
    if not keys:
        return None
    header = request.headers.get("authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not any(secrets.compare_digest(key, k) for k in keys):
        raise APIError(401, "invalid_api_key", "missing or invalid API key (Authorization: Bearer KEY)")
    return key


Service = Annotated[LeylineService, Depends(get_service)]  # the app's service, as a parameter type
Owner = Annotated[str | None, Depends(owner)]  # the caller's API key, as a parameter type
