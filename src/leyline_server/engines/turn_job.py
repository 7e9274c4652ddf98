"""The one turn job every engine runs where its KV lives: splice if asked, prefill, release on error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leyline_server.contract.base import SpliceBackend
from leyline_server.contract.values import CacheScope, Handle, SpliceRequest, Turn
from leyline_server.splice import splice

__all__ = ["run_turn"]


def run_turn(
    backend: SpliceBackend[Any],
    prompt: Sequence[int],
    scope: CacheScope,
    session: Handle | None,
    request: SpliceRequest | None,
) -> Turn:
    """Splice ``session`` if ``request`` has directives, then prefill ``prompt`` from the result.

    ``session`` is consumed: the prefill releases it (``previous=``), and any failure after the
    splice releases what the splice returned. A strict ``SpliceError`` leaves ``session`` as it
    was (the executor raises before changing anything).
    """
    handle, report = session, None
    if handle is not None and request is not None and request.directives:
        handle, report = splice(backend, handle, request)
    try:
        result = backend.prefill(prompt, scope, previous=handle)
    except BaseException:
        if handle is not None:
            backend.release(handle)
        raise
    return Turn(result.handle, list(prompt), report, result.reused, result.approximate, result.last_logits)
