"""Where a turn's time to its first token goes, as the ``leyline.timings`` field reports it.

:class:`Clock` starts when the pipeline opens the turn and is marked after each step
(:mod:`.pipeline`); the engine adds its own share (``Turn.timings``: waiting for the engine
thread, the splice, the prefill's chunks). All in milliseconds:

``admit`` (a slot of the key's share), ``render`` (the prompt, and for a plain client the
conversation it continues), ``constrain`` (the length check and the output constraint's grammar, its compile started),
``reserve`` (the session, the KV reservation, and the answer's start before the prefill),
``queue`` (waiting for the engine thread), ``splice``, ``prefill`` (its chunks, other keys' steps
between them included), ``compile`` (the wait for the constraint's compile once the prefill is
done: it compiles beside the prefill), ``first_token`` (from the prefill's end to the first token handed to the
route) and ``total`` (from the turn's opening to that token). The parts add up to ``total`` within a millisecond or so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["Clock"]

_ENGINE = ("queue", "splice", "prefill")


class Clock:
    """Marks of one turn (``time.perf_counter``), turned into the ``timings`` field."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.parts: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """The time since the previous mark is ``name``'s."""
        now = time.perf_counter()
        self.parts[name] = (now - self.last) * 1e3
        self.last = now

    def turn_timings(self, engine: Mapping[str, float]) -> dict[str, float]:
        """The marks so far with the engine's share split out of the ``turn`` mark."""
        out = {k: round(v, 3) for k, v in self.parts.items() if k != "turn"}
        inside = sum(engine.get(k, 0.0) for k in _ENGINE)
        out["reserve"] = round(max(self.parts.get("turn", 0.0) - inside, 0.0), 3)
        out.update({k: round(engine.get(k, 0.0), 3) for k in _ENGINE})
        return out

    def first_token(self) -> dict[str, float]:
        """``first_token`` and ``total``, at the first token."""
        now = time.perf_counter()
        return {"first_token": round((now - self.last) * 1e3, 3), "total": round((now - self.started) * 1e3, 3)}
