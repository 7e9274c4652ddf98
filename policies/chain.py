"""Chain: run policies in order, each on the conversation as the previous ones left it."""

from __future__ import annotations

from collections.abc import Callable

from leyline_policies.base import Conversation, Edit, Policy, PolicyBase, apply_edits, as_policy, merge_edits

__all__ = ["Chain"]


class Chain(PolicyBase):
    """Compose policies: ``Chain(a, b)`` (or ``a | b``); nested chains are flattened.

    Later policies see earlier edits applied; when two edit one message the later content wins,
    except that ``forget`` is never downgraded to ``amortize``, the stronger kind stays and an
    erratum is kept (:func:`~leyline_policies.base.merge_edits`)::

        policy = Redact([r"sk-\\w+"]) | StaleToolDetector() | TruncateOlderThanN(2)
    """

    name = "chain"
    policies: tuple[Policy, ...]

    def __init__(self, *policies: Policy | Callable[[Conversation], list[Edit]]) -> None:
        flat: list[Policy] = []
        for p in policies:
            flat.extend(p.policies if isinstance(p, Chain) else [as_policy(p)])
        self.policies = tuple(flat)

    def propose(self, conversation: Conversation) -> list[Edit]:
        """The merged edits of every policy."""
        merged: dict[int, Edit] = {}
        current = conversation
        for policy in self.policies:
            edits = policy.propose(current)
            for e in edits:
                earlier = merged.get(e.index)
                merged[e.index] = merge_edits(earlier, e) if earlier is not None else e
            if edits:
                current = Conversation(tuple(apply_edits(current.messages, edits)), current.tools)
        return [merged[i] for i in sorted(merged)]
