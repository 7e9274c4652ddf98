"""What a session reports per request (:class:`TurnStats`) and a request in preparation (``_Turn``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from leyline_sdk.policy_run import EditReport
from leyline_sdk.rendering import RenderedConversation
from leyline_sdk.wire import LeylineRequest, SpliceCounts

__all__ = ["TurnStats"]


class TurnStats(BaseModel):
    """What one request cost and what Leyline did."""

    turn: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    approximate_tokens: int = 0
    directives: int = 0
    fallback: str | None = None
    cleared: int = 0
    removed_chars: int = 0
    elapsed_ms: float = 0.0
    blocks: int = 0  # block messages placed by relocation (directives naming a block)
    block_fallback: str | None = None  # why a new block message was prefilled instead (e.g. "no_base")
    sources: list[str] = []  # who made each explained directive: "template", "policy" or "client"
    template_directives: int = 0  # directives for edits the chat template made (e.g. dropped reasoning)
    policy_directives: int = 0  # directives for the policies' edits

    def attribute(self, sources: Sequence[str]) -> None:
        """Record who made each directive (see ``leyline_sdk.templates.Source``)."""
        self.sources = [str(getattr(s, "value", s)) for s in sources]
        self.template_directives = self.sources.count("template")
        self.policy_directives = self.sources.count("policy")

    def count(self, counts: SpliceCounts) -> None:
        """Copy the server's token counts."""
        self.reused_tokens = counts.reused_tokens
        self.rotated_tokens = counts.rotated_tokens
        self.prefilled_tokens = counts.prefilled_tokens
        self.approximate_tokens = counts.approximate_tokens


@dataclass
class _Turn:
    """One request in preparation: the effective messages, their rendering, what is sent.

    ``started`` is when the session began preparing it (``time.perf_counter()``).
    """

    effective: list[dict[str, Any]]
    prompt: RenderedConversation | None
    report: EditReport
    started: float = 0.0
    extension: LeylineRequest | None = None
    fallback: str | None = None
    block_ids: tuple[str, ...] = ()
    block_fallback: str | None = None
    sources: list[str] = field(default_factory=list)
