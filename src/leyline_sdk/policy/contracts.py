"""The policy contract: ``Policy`` (one ``propose`` over a ``Conversation``), its base and ``Chain``.

A policy looks at the conversation and proposes edits; it knows nothing of tokens or KV::

    class Policy(Protocol):
        name: str
        def propose(self, conversation: Conversation) -> list[Edit]: ...

Plain functions ``(Conversation) -> list[Edit]`` are policies too (:func:`as_policy`), and
policies compose with ``|`` into a :class:`Chain`. The built-in policies live in
``leyline_policies``; this module is the SDK's pure core that they and sessions share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from leyline_sdk.policy.edits import Conversation, Edit, apply_edits, merge_edits

__all__ = ["Policy", "PolicyBase", "FunctionPolicy", "as_policy", "Chain"]


@runtime_checkable
class Policy(Protocol):
    """Anything with a ``name`` and ``propose(conversation) -> list[Edit]``."""

    name: str

    def propose(self, conversation: Conversation) -> list[Edit]:
        """The edits this policy wants now."""
        ...


class PolicyBase:
    """Convenience base: ``|`` chains policies."""

    name: str = "policy"

    def propose(self, conversation: Conversation) -> list[Edit]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __or__(self, other: Policy | Callable[[Conversation], list[Edit]]) -> Policy:
        return Chain(self, other)


class FunctionPolicy(PolicyBase):
    """A plain function used as a policy."""

    def __init__(self, fn: Callable[[Conversation], list[Edit]], name: str | None = None) -> None:
        self.fn = fn
        self.name = str(name or getattr(fn, "__name__", "function"))

    def propose(self, conversation: Conversation) -> list[Edit]:
        """Call the function."""
        return list(self.fn(conversation))


def as_policy(obj: Policy | Callable[[Conversation], list[Edit]]) -> Policy:
    """A policy object from a policy or a plain function."""
    if isinstance(obj, Policy):
        return obj
    if callable(obj):
        return FunctionPolicy(obj)
    raise TypeError(f"not a policy: {obj!r}")


class Chain(PolicyBase):
    """Compose policies: ``Chain(a, b)`` (or ``a | b``); nested chains are flattened.

    Later policies see earlier edits applied; when two edit one message the later content wins,
    except that ``forget`` is never downgraded to ``amortize``, the stronger kind stays and an
    erratum is kept (:func:`~leyline_sdk.policy.edits.merge_edits`)::

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
