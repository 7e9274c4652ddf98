"""The turn as one job, for an engine whose own scheduler orders the work (SGLang).

Every engine's turn is the same three steps: the splice for the turn
(:func:`~leyline_server.splice.splice_for_turn`: a ``forget``, asked or a fallback, is left to the
prefill), the prompt's prefill from what the splice returned, and a deferred forget's counts
settled (:func:`~leyline_server.splice.settle_forget`). The threaded engines run these steps on
their scheduler, the splice and the prefill in chunks between other keys' work
(:meth:`~leyline_server.engines.threaded.ThreadedEngine.start_turn`); :func:`run_turn` runs them
in one go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leyline_server.contract.base import SpliceBackend
from leyline_server.contract.values import CacheScope, Handle, SpliceRequest, Turn
from leyline_server.splice import drain, settle_forget, splice_for_turn

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
        handle, report = drain(splice_for_turn(backend, handle, request))
    try:
        result = backend.prefill(prompt, scope, previous=handle)
    except BaseException:
        if handle is not None:
            backend.release(handle)
        raise
    if report is not None and report.deferred:
        report = settle_forget(report, result.reused)
    return Turn(result.handle, list(prompt), report, result.reused, result.approximate, result.last_logits)
