"""What a session reports per request: :class:`TurnStats`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from leyline_sdk.core.wire import SpliceCounts
from leyline_sdk.session.turn import PreparedTurn

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
    elapsed_ms: float = 0.0  # from preparing the request to recording its answer
    prepare_ms: float = 0.0  # of which the session's own work before sending (policies, render, diff)
    blocks: int = 0  # block messages placed by relocation (directives naming a block)
    block_fallback: str | None = None  # why a new block message was prefilled instead (e.g. "no_base")
    sources: list[str] = []  # who made each explained directive: "template", "policy" or "client"
    template_directives: int = 0  # directives for edits the chat template made (e.g. dropped reasoning)
    policy_directives: int = 0  # directives for the policies' edits
    client_directives: int = 0  # directives for the agent's own edits of its history

    @classmethod
    def of_turn(cls, number: int, turn: PreparedTurn, usage: Any) -> TurnStats:
        """The stats of request ``number``: what ``turn`` sent and, from ``usage``, the prompt's tokens."""
        stats = cls(
            turn=number,
            cleared=len(turn.report.cleared),
            removed_chars=turn.report.removed_chars,
            directives=len(turn.extension.directives) if turn.extension else 0,
            fallback=turn.fallback,
            blocks=len(turn.block_ids),
            block_fallback=turn.block_fallback,
        )
        stats.attribute(turn.sources)
        if usage is not None:  # Chat Completions' usage, or the Responses API's (input_tokens)
            prompt = getattr(usage, "prompt_tokens", None)
            stats.prompt_tokens = prompt if prompt is not None else getattr(usage, "input_tokens", 0)
            details = getattr(usage, "prompt_tokens_details", None) or getattr(usage, "input_tokens_details", None)
            stats.cached_tokens = getattr(details, "cached_tokens", 0) or 0
        return stats

    def attribute(self, sources: Sequence[str]) -> None:
        """Record who made each directive (see ``leyline_sdk.explain.templates.Source``)."""
        self.sources = [str(getattr(s, "value", s)) for s in sources]
        self.template_directives = self.sources.count("template")
        self.policy_directives = self.sources.count("policy")
        self.client_directives = self.sources.count("client")

    def count(self, counts: SpliceCounts) -> None:
        """Copy the server's token counts."""
        self.reused_tokens = counts.reused_tokens
        self.rotated_tokens = counts.rotated_tokens
        self.prefilled_tokens = counts.prefilled_tokens
        self.approximate_tokens = counts.approximate_tokens
