"""The llama.cpp engine behind the service-facing :class:`~leyline_server.contract.base.Engine` protocol.

All llama.cpp work runs on the scheduler's one engine thread (a context is not thread-safe), in
batched steps; see ``engines.threaded`` and ``engines.scheduler``. Closing the engine frees
llama.cpp's memory after the queued jobs ran.
"""

from __future__ import annotations

from typing import Any

from leyline_server.engines.llamacpp.engine import LlamaCppEngine
from leyline_server.engines.llamacpp.stage import Stage
from leyline_server.engines.threaded import ThreadedEngine

__all__ = ["AsyncLlamaCppEngine"]


class AsyncLlamaCppEngine(ThreadedEngine[Stage]):
    """:class:`LlamaCppEngine` on its own thread, as an :class:`~leyline_server.contract.base.Engine`."""

    def __init__(self, core: LlamaCppEngine, tokenizer: object = None, **scheduling: Any) -> None:
        """``scheduling``: the scheduler's ``chunk_size``, ``max_running`` and ``ahead``."""
        super().__init__(core, tokenizer, "leyline-llamacpp", **scheduling)
