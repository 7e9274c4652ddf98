"""Test helpers: the real server in a background thread (see ``leyline_server.background``)."""

from __future__ import annotations

from leyline_server.background import free_port, make_service
from leyline_server.background import serve_in_thread as running_server

__all__ = ["free_port", "make_service", "running_server"]
