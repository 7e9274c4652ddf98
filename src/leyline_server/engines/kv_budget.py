"""How large the KV pool is when ``--kv-budget-mb`` is not given: sized from the machine.

The rule (:func:`machine_budget`), for the *served context* (``--context-length``, else the
model's own) at the engine's bytes per token (its KV dtype, its layers and heads):

* the pool holds the served context ``CONTEXTS`` times (a session and a request, or two requests
  of a full context at once), and at least ``FLOOR_MB`` (the old fixed default);
* it takes at most ``SAFETY_FRACTION`` of the memory available at start (``MemAvailable`` in
  ``/proc/meminfo``; the rest is for the weights, the embedded engine's mirrors, llama.cpp's
  parked sessions and the activations);
* it always holds one served context: a ``--context-length`` the safe share of the machine
  cannot hold is refused with both numbers; without ``--context-length`` the model's context is
  capped by the pool, as before.

An explicit ``--kv-budget-mb`` (or ``--mem-fraction-static``) wins. The engine logs its pool at
start: ``KV pool: N tokens, X MiB, from ...`` (:func:`log_pool`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

__all__ = ["CONTEXTS", "FLOOR_MB", "SAFETY_FRACTION", "Budget", "available_bytes", "machine_budget", "log_pool"]

CONTEXTS = 2  # served contexts the default pool holds
FLOOR_MB = 256.0  # the default pool is at least this large (when the machine's safe share allows it)
SAFETY_FRACTION = 0.5  # of the memory available at start, the most the default pool takes
log = logging.getLogger("leyline.engine")


@dataclass(frozen=True)
class Budget:
    """A KV pool size in MiB and where it came from (for the start-up log line)."""

    mb: float
    source: str


def available_bytes() -> int:
    """Memory available for new allocations now: ``MemAvailable`` (``/proc/meminfo``), else the
    free physical pages (``sysconf``), which omit the page cache the kernel would give back."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def machine_budget(context_tokens: int, bytes_per_token: int, available: int, asked: bool, granule: int = 1) -> Budget:
    """The default pool for a served context of ``context_tokens`` (see the module docstring).

    ``available``: bytes of memory available; ``asked``: the context is ``--context-length``
    (refused if the machine cannot hold it) rather than the model's own (capped by the pool);
    ``granule``: the engine's pool grows in steps of this many tokens.
    """
    mib = 2**20
    need = math.ceil(context_tokens / granule) * granule * bytes_per_token / mib
    usable = available * SAFETY_FRACTION / mib
    if need > usable and asked:
        raise ValueError(
            f"--context-length {context_tokens} needs a KV pool of {math.ceil(need):,} MiB "
            f"({bytes_per_token:,} bytes a token), more than this machine can give it: "
            f"{usable:,.0f} MiB ({SAFETY_FRACTION:g} of the {available / mib:,.0f} MiB available); lower "
            "--context-length, or set --kv-budget-mb to take more of the machine"
        )
    want = max(CONTEXTS * need, FLOOR_MB)
    why = f"{CONTEXTS} x the {context_tokens:,}-token context" if want > FLOOR_MB else f"the {FLOOR_MB:g} MiB floor"
    if want > usable:
        want, why = usable, f"{SAFETY_FRACTION:g} of the memory available"
    return Budget(want, f"the machine: {why}, {available / mib:,.0f} MiB available")


def log_pool(tokens: int, bytes_per_token: int, source: str) -> None:
    """The start-up line that says how large the KV pool is and why."""
    mb = tokens * bytes_per_token / 2**20
    log.info("KV pool: %d tokens, %s MiB, from %s", tokens, f"{mb:,.0f}" if mb >= 10 else f"{mb:.2f}", source)
