"""Collections that skip the startup heap: a full GC pause no longer walks the model's objects.

A server process holds millions of objects it made before its first request (the model's modules,
the tokenizer, the libraries). CPython's oldest-generation collection walks every one of them, with
the GIL held: ~0.3–0.5 s per collection at two million objects on two cores, during which no
stream advances and ``/health`` does not answer. Like vLLM's ``freeze_gc_heap``, the server
collects once when it starts and moves what is left into the permanent generation
(:func:`gc.freeze`), which collections skip; objects made while serving are collected as before.

In-process servers (:func:`leyline_server.local.serve_in_thread`) share the host's heap: the
freeze is counted, and the last server to stop gives the frozen objects back to the collector
(:func:`gc.unfreeze`), so garbage made of them is reclaimed again once no server runs.
"""

from __future__ import annotations

import gc
import logging
import threading

__all__ = ["freeze_startup_heap", "thaw_startup_heap"]

log = logging.getLogger("leyline.server")
_lock = threading.Lock()
_servers = 0


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many the collector now skips."""
    global _servers
    with _lock:
        _servers += 1
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    log.info("%s objects made before serving are out of the collector's walk", f"{frozen:,}")
    return frozen


def thaw_startup_heap() -> None:
    """Undo one :func:`freeze_startup_heap`; the last one hands the frozen objects back to the collector."""
    global _servers
    with _lock:
        _servers = max(0, _servers - 1)
        if _servers == 0:
            gc.unfreeze()
