"""The embedded engine behind the service-facing :class:`~leyline_server.contract.base.Engine` protocol."""

from __future__ import annotations

from typing import Any

from leyline_server.engines.embedded.engine import EmbeddedEngine, SlotStage
from leyline_server.engines.threaded import ThreadedEngine

__all__ = ["AsyncEmbeddedEngine"]


class AsyncEmbeddedEngine(ThreadedEngine[SlotStage]):
    """:class:`EmbeddedEngine` on its own thread (all model work there; see ``engines.threaded``)."""

    def __init__(self, core: EmbeddedEngine, tokenizer: object = None, **scheduling: Any) -> None:
        """``scheduling``: the scheduler's ``chunk_size``, ``max_running`` and ``ahead``."""
        super().__init__(core, tokenizer, "leyline-embedded", **scheduling)
