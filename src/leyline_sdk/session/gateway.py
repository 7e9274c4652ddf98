"""A client behind a gateway (SGLang's router): routing keys, the metadata carrier, router detection.

SGLang's router (``sglang-router``) re-serializes each chat request: it drops the ``leyline``
body field and every custom header but its routing header, keeps OpenAI's ``metadata`` map, and
does not proxy ``/v1/leyline/*`` (404). A client behind it therefore

* sends each session's own routing key in one header (``X-SMG-Routing-Key`` by default) on
  every request, so the router's ``manual`` policy pins the session to one replica;
* sends the ``leyline`` extension as a JSON string in ``metadata["leyline"]`` (the server reads
  it there as it reads the field), keeping the caller's own metadata;
* uses nothing but ``/v1/chat/completions``: a local tokenizer renders, the first chat opens the
  session, ``sync_edits`` is left to the next turn, and sessions are never deleted explicitly
  (the server's idle limit drops them).

A client is in this mode when built with ``behind_router=True``, or from the first 404 on a
Leyline route when the server's root answers ``GET /get_server_info`` as SGLang's router does
(``{"router_manager": ...}``); the switch is logged once (``logging.warning``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leyline_sdk.session.port import LeylineRoutes

__all__ = ["DEFAULT_ROUTING_HEADER", "Gateway", "detect_router", "with_carrier"]

DEFAULT_ROUTING_HEADER = "X-SMG-Routing-Key"
CARRIER_KEY = "leyline"
SGLANG_ROUTER = "SGLang's router (sglang-router)"

logger = logging.getLogger("leyline_sdk")


@dataclass(frozen=True)
class Gateway:
    """How requests reach the server through a gateway: the routing header and the gateway's name."""

    routing_header: str = DEFAULT_ROUTING_HEADER
    name: str = "a gateway"


def root_url(base_url: str) -> str:
    """The server root of an OpenAI ``base_url`` (``http://h:p/v1`` → ``http://h:p``)."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


async def detect_router(routes: LeylineRoutes, base_url: str, routing_header: str) -> Gateway | None:
    """SGLang's router in front of ``base_url`` (its ``/get_server_info`` says ``router_manager``), else ``None``.

    Called after a Leyline route answered 404; any error answer means "not a router".
    """
    try:
        info = await routes.get(root_url(base_url) + "/get_server_info")
        if isinstance(info, str | bytes):  # the router answers JSON as text/plain
            info = json.loads(info)
    except (routes.failure, ValueError):
        return None
    if not isinstance(info, Mapping) or "router_manager" not in info:
        return None
    gateway = Gateway(routing_header, SGLANG_ROUTER)
    logger.warning(
        "%s answers at %s and does not proxy /v1/leyline/*: sessions now send the routing header %s "
        "and the leyline extension in metadata[%r], over /v1/chat/completions only "
        "(pass tokenizer= to splice behind it)",
        SGLANG_ROUTER,
        base_url,
        routing_header,
        CARRIER_KEY,
    )
    return gateway


def with_carrier(user_metadata: Any, extension: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``metadata``: the caller's own entries plus ``leyline`` as a JSON string."""
    metadata = dict(user_metadata) if isinstance(user_metadata, Mapping) else {}
    metadata[CARRIER_KEY] = json.dumps(extension, separators=(",", ":"))
    return metadata
