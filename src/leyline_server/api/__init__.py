"""OpenAI-compatible HTTP API with the Leyline extension (FastAPI)."""

from leyline_server.api.app import create_app

__all__ = ["create_app"]
