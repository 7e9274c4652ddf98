"""The embedded engine behind the service-facing :class:`~leyline_server.engines.base.Engine` protocol."""

from __future__ import annotations

from leyline_server.engines.embedded.engine import EmbeddedEngine, SlotStage
from leyline_server.engines.threaded import ThreadedEngine

__all__ = ["AsyncEmbeddedEngine"]


class AsyncEmbeddedEngine(ThreadedEngine[SlotStage]):
    """:class:`EmbeddedEngine` on its own thread (all model work there; see ``engines.threaded``)."""

    def __init__(self, core: EmbeddedEngine, tokenizer: object = None) -> None:
        super().__init__(core, tokenizer, "leyline-embedded")
