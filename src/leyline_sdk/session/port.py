"""How the session layer reaches the server: :class:`LeylineRoutes`, a port the client layer implements.

``/leyline/tokenize``, ``/leyline/sessions/...`` and ``/leyline/blocks`` are JSON routes; the
session layer names them and reads their answers, and never touches the transport itself. The
client layer (:mod:`leyline_sdk.client.routes`) implements this port over openai-python's
``post`` / ``get`` / ``delete``, so one transport, one retry policy, one set of headers and one
error tree serve these routes and ``chat.completions`` alike.

The port also names the transport's error classes, so that the session layer can tell a 404 from
any other failure without importing the transport (``not_found``, ``failure``), and the error a
strict session raises when an edit could not be spliced as asked (``fallback_error``: the client
layer's :class:`~leyline_sdk.client.fallback.SpliceFallbackError`, an ``openai.OpenAIError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["LeylineRoutes"]


class LeylineRoutes(Protocol):
    """Leyline's JSON routes (paths relative to the client's ``base_url``) and the transport's errors.

    ``not_found``: the class of the transport's 404 error; ``failure``: the base class of every
    error a request can end in (an error status or no answer at all); ``fallback_error``: what a
    strict session raises (see the module docstring).
    """

    not_found: type[Exception]
    failure: type[Exception]

    def fallback_error(self, code: str, message: str, completion: Any = None) -> Exception:
        """The exception a strict session raises for fallback ``code`` (``completion``: what was served)."""
        ...

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST ``body``; the decoded JSON answer."""
        ...

    async def get(self, path: str) -> Any:
        """GET; the decoded JSON answer."""
        ...

    async def delete(self, path: str) -> Any:
        """DELETE; the decoded JSON answer."""
        ...
