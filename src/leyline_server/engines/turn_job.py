"""The turn as one job, for an engine whose own scheduler orders the work (SGLang): splice if asked
(a ``forget`` computed inside the splice), prefill, release on error.

The threaded engines (embedded, llama.cpp) run the same splice executor on their scheduler as
:func:`~leyline_server.splice.splice_for_turn`, which leaves a ``forget`` to the turn's prefill
and settles its counts after it. Running that form here too changes which tokens SGLang's cache
holds after a forget (``tests/sglang/test_gpu_bench.py``), so the two forms stay for now.
"""

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
