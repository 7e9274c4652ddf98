"""TokenBudget: run another policy only when the context passes a size trigger."""

from __future__ import annotations

from collections.abc import Callable

from leyline_policies.base import Conversation, Edit, Policy, PolicyBase, as_policy, content_text

__all__ = ["TokenBudget", "approx_tokens"]


def approx_tokens(conversation: Conversation) -> int:
    """A tokenizer-free estimate: about 4 characters per token."""
    return sum(len(content_text(m)) for m in conversation.messages) // 4


class TokenBudget(PolicyBase):
    """Apply ``inner``'s edits only above ``trigger_tokens`` and only if they free ``min_freed_tokens``.

    ``count`` measures the conversation (default: characters / 4; pass a real tokenizer count
    for precision)::

        TokenBudget(TruncateOlderThanN(2), trigger_tokens=100_000, min_freed_tokens=5_000)
    """

    name = "token_budget"

    def __init__(
        self,
        inner: Policy | Callable[[Conversation], list[Edit]],
        trigger_tokens: int,
        min_freed_tokens: int = 0,
        count: Callable[[Conversation], int] = approx_tokens,
    ) -> None:
        if trigger_tokens < 0 or min_freed_tokens < 0:
            raise ValueError("trigger_tokens and min_freed_tokens must be >= 0")
        self.inner = as_policy(inner)
        self.trigger_tokens = trigger_tokens
        self.min_freed_tokens = min_freed_tokens
        self.count = count

    def propose(self, conversation: Conversation) -> list[Edit]:
        """``inner``'s edits, or none below the trigger or when they free too little."""
        if self.count(conversation) <= self.trigger_tokens:
            return []
        edits = self.inner.propose(conversation)
        freed = (
            sum(
                max(len(content_text(conversation.messages[e.index])) - len(e.replacement), 0)
                for e in edits
                if e.replacement is not None
            )
            // 4
        )
        return edits if freed >= self.min_freed_tokens else []
