"""Test helpers: the real server in a background thread (see ``leyline_server.local``)."""

from __future__ import annotations

from leyline_server.local import free_port, local_service
from leyline_server.local import serve_in_thread as running_server

make_service = local_service

__all__ = ["free_port", "make_service", "running_server"]
