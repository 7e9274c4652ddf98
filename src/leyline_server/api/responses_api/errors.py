"""Item refusals (``leyline_sdk.core.responses_items.ItemError``) as the server's API errors."""

from __future__ import annotations

from leyline_sdk.core.responses_items import ItemError
from leyline_server.api.errors import APIError

__all__ = ["as_api_error"]


def as_api_error(exc: ItemError) -> APIError:
    """The HTTP answer to an item or tool that cannot be a chat message."""
    return APIError(exc.status, exc.code, exc.message, exc.param)
