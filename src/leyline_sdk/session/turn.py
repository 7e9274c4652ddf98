"""One request in preparation: :class:`PreparedTurn`, the per-turn state a session builds and sends.

A session prepares a turn (the policies' effective messages, their rendering, the ``leyline``
extension), the client sends it with openai's own ``create``, and the session records the answer
(:meth:`~leyline_sdk.session.session.LeylineSession.record`). Everything that lives for one turn
only lives here, not on the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leyline_sdk.core.directives import Mode
from leyline_sdk.core.wire import LeylineRequest
from leyline_sdk.policy.run import EditReport
from leyline_sdk.render.rendering import RenderedConversation

__all__ = ["PreparedTurn"]


@dataclass
class PreparedTurn:
    """One request in preparation: the effective messages, their rendering, what is sent.

    * ``started``: when the session began preparing it (``time.perf_counter()``); ``prepared``: when
      it was ready to send;
    * ``extension``: the ``leyline`` field (``None`` against a server without Leyline);
    * ``fallback``: why no directives are sent (a :class:`~leyline_sdk.core.fallbacks.FallbackCode` value);
    * ``sources``: who made each directive (``template``, ``policy``, ``client``);
    * ``block_indices``, ``block_ids``, ``block_fallback``: block messages this turn, the blocks
      placed, why one was not;
    * ``modes``: each edited message's mode, by effective index; ``unedited``: on an unstable
      template, the prompt rendered without this turn's edits of seen messages.
    """

    effective: list[dict]
    prompt: RenderedConversation | None
    report: EditReport
    started: float = 0.0
    prepared: float = 0.0
    extension: LeylineRequest | None = None
    fallback: str | None = None
    sources: list[str] = field(default_factory=list)
    block_indices: set[int] = field(default_factory=set)
    block_ids: tuple[str, ...] = ()
    block_fallback: str | None = None
    modes: dict[int, Mode] = field(default_factory=dict)
    unedited: list[int] | None = None
