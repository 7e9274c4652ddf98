"""Radix prefix cache (page size 1): token sequences -> the slots that hold their KV.

Contract (the tree knows tokens and slots only):

* Every slot in the tree is owned by exactly one node. ``insert`` never takes ownership of a
  slot for a token that is already in the tree: it hands such *duplicate* slots back to the
  caller, who frees them.
* Lock a node (``lock``) before using the slots of its path; a locked path is never evicted.
  ``unlock`` must balance every ``lock``.
* ``evict(n)`` removes least-recently-used unlocked leaves until at least ``n`` slots are freed
  (or nothing evictable is left) and returns the freed slots; ``evict(0)`` is always safe.
* ``check_integrity(capacity, free)`` verifies free + owned == capacity with no slot twice, and
  that lock counts are consistent.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["RadixCache", "Node", "MatchResult", "InsertResult"]

_clock = itertools.count()


class Node:
    """A run of tokens and their slots; children keyed by their first token."""

    __slots__ = ("key", "slots", "children", "parent", "locks", "last_used")

    def __init__(self, key: list[int], slots: torch.Tensor, parent: Node | None) -> None:
        self.key = key
        self.slots = slots
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.locks = 0
        self.last_used = next(_clock)


class MatchResult(NamedTuple):
    """The longest cached prefix: its length, its slots and the node where it ends."""

    length: int
    slots: torch.Tensor
    node: Node


class InsertResult(NamedTuple):
    """The node that ends the inserted path and the caller's slots that were duplicates."""

    node: Node
    duplicate_slots: torch.Tensor


def _common_length(a: Sequence[int], a_start: int, b: Sequence[int]) -> int:
    n = 0
    limit = min(len(a) - a_start, len(b))
    while n < limit and a[a_start + n] == b[n]:
        n += 1
    return n


class RadixCache:
    """Prefix tree over token ids with LRU eviction of unlocked leaves and hit statistics."""

    def __init__(self) -> None:
        self.root = Node([], torch.empty(0, dtype=torch.int64), None)
        self.root.locks = 1  # never evicted
        self.requested_tokens = 0
        self.hit_tokens = 0

    # -- lookup -------------------------------------------------------------------------------
    def _split(self, node: Node, at: int) -> Node:
        """Split ``node`` so that its first ``at`` tokens form a new parent; return that parent."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = Node(node.key[:at], node.slots[:at], parent)
        head.locks = node.locks
        head.last_used = node.last_used
        parent.children[head.key[0]] = head
        node.key, node.slots = node.key[at:], node.slots[at:]
        node.parent = head
        head.children[node.key[0]] = node
        return head

    def match_prefix(self, tokens: Sequence[int], record: bool = True) -> MatchResult:
        """Longest cached prefix of ``tokens`` (splits a node so the result ends on a node)."""
        node, pos, parts = self.root, 0, []
        stamp = next(_clock)
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_length(tokens, pos, child.key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_used = stamp
            parts.append(child.slots)
            node, pos = child, pos + n
        if record:
            self.requested_tokens += len(tokens)
            self.hit_tokens += pos
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        return MatchResult(pos, slots, node)

    def insert(self, tokens: Sequence[int], slots: torch.Tensor) -> InsertResult:
        """Insert ``tokens`` -> ``slots``; slots of tokens already cached come back as duplicates."""
        if len(tokens) != len(slots):
            raise ValueError("tokens and slots differ in length")
        match = self.match_prefix(tokens, record=False)
        dup = slots[: match.length]
        dup = dup[dup != match.slots]  # the caller may pass the cached slots themselves
        node = match.node
        if match.length < len(tokens):
            leaf = Node(list(tokens[match.length :]), slots[match.length :].clone(), node)
            node.children[leaf.key[0]] = leaf
            node = leaf
        return InsertResult(node, dup)

    def path_slots(self, node: Node) -> torch.Tensor:
        """Slots of the whole path from the root to ``node``."""
        parts = []
        while node.parent is not None:
            parts.append(node.slots)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else torch.empty(0, dtype=torch.int64)

    # -- locking and eviction ---------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Protect the path root..node from eviction."""
        while node is not None:
            node.locks += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        """Release one ``lock`` of the path root..node."""
        while node is not None:
            if node.locks <= 0:
                raise RuntimeError("unbalanced unlock")
            node.locks -= 1
            node = node.parent  # type: ignore[assignment]

    def _nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def evictable_tokens(self) -> int:
        """Tokens held by unlocked nodes."""
        return sum(len(n.key) for n in self._nodes() if n.locks == 0)

    def evict(self, n: int) -> torch.Tensor:
        """Evict LRU unlocked leaves until ``n`` slots are freed; return the freed slots."""
        freed: list[torch.Tensor] = []
        count = 0
        while count < n:
            leaves = [x for x in self._nodes() if not x.children and x.locks == 0 and x.parent is not None]
            if not leaves:
                break
            victim = min(leaves, key=lambda x: x.last_used)
            del victim.parent.children[victim.key[0]]  # type: ignore[union-attr]
            freed.append(victim.slots)
            count += len(victim.slots)
        return torch.cat(freed) if freed else torch.empty(0, dtype=torch.int64)

    # -- statistics and invariants --------------------------------------------------------------
    @property
    def hit_rate(self) -> float:
        """Fraction of requested tokens found in the cache."""
        return self.hit_tokens / self.requested_tokens if self.requested_tokens else 0.0

    def owned_slots(self) -> list[int]:
        """Every slot owned by a node (with repetitions, if the invariant is broken)."""
        return [int(s) for node in self._nodes() for s in node.slots.tolist()]

    def check_integrity(
        self, capacity: int, free: set[int], in_flight: set[int] | frozenset[int] = frozenset()
    ) -> None:
        """Raise ``AssertionError`` unless free + owned (+ in flight) == all slots, each once."""
        owned = self.owned_slots()
        assert len(owned) == len(set(owned)), "a slot is owned by two nodes"
        everything = set(owned) | free | set(in_flight)
        assert not (set(owned) & free), "a slot is both free and owned"
        assert len(owned) + len(free) + len(in_flight) == capacity == len(everything), (
            f"owned {len(owned)} + free {len(free)} + in flight {len(in_flight)} != capacity {capacity}"
        )
        for node in self._nodes():
            assert node.locks >= 0, "negative lock count"
            assert node.locks >= sum(c.locks for c in node.children.values()) or node is self.root
            for first, child in node.children.items():
                assert child.parent is node and child.key and child.key[0] == first
                assert len(child.key) == len(child.slots)
