"""Radix prefix cache (page size 1): token sequences -> the slots that hold their KV, per namespace.

Contract (the tree knows tokens, slots and namespaces only):

* Every slot in the tree is owned by exactly one node. ``insert`` never takes ownership of a
  slot for a token already cached on the same path: it hands such *duplicate* slots back to the
  caller, who frees them.
* **Namespaces.** Exact KV lives under ``("exact", salt)``; approximate KV (rotated, or computed
  after rotated KV) under ``("private", salt, tag)``. A match walks exact nodes of its salt and,
  if the scope carries a private tag, that tag's private nodes; private nodes only ever hang
  below exact nodes of the same salt or private nodes of the same tag. A plain request therefore
  never sees rotated KV, and with per-key salts one key never sees another key's prefixes.
* Lock a node (``lock``) before using the slots of its path; a locked path is never evicted.
  ``unlock`` must balance every ``lock``.
* ``evict(n)`` removes least-recently-used unlocked leaves until at least ``n`` slots are freed
  (or nothing evictable is left) and returns the freed slots; ``evict(0)`` is always safe. It
  keeps a heap of leaves: evicting ``k`` tokens costs O(leaves + k log leaves), not O(nodes·k).
* ``check_integrity(capacity, free)`` verifies free + owned == capacity with no slot twice, and
  that lock counts and namespaces are consistent.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

from leyline_server.contract.values import SHARED, CacheScope

__all__ = ["RadixCache", "Node", "MatchResult", "InsertResult"]

Namespace = tuple[str | None, ...]
_EMPTY = torch.empty(0, dtype=torch.int64)


def exact_ns(scope: CacheScope) -> Namespace:
    """The namespace of exact KV for ``scope``."""
    return ("exact", scope.salt)


def private_ns(scope: CacheScope) -> Namespace | None:
    """The namespace of ``scope``'s approximate KV (``None`` without a private tag)."""
    return ("private", scope.salt, scope.private) if scope.private is not None else None


class Node:
    """A run of tokens and their slots; children keyed by (namespace, first token)."""

    __slots__ = ("key", "slots", "children", "parent", "locks", "last_used", "ns")

    def __init__(self, key: list[int], slots: torch.Tensor, parent: Node | None, ns: Namespace, stamp: int) -> None:
        self.key = key
        self.slots = slots
        self.children: dict[tuple[Namespace, int], Node] = {}
        self.parent = parent
        self.locks = 0
        self.last_used = stamp
        self.ns = ns

    @property
    def private(self) -> bool:
        """Whether this node holds approximate KV."""
        return self.ns[0] == "private"


class MatchResult(NamedTuple):
    """The longest cached prefix: its length, slots, end node, and how much of it is exact."""

    length: int
    slots: torch.Tensor
    node: Node
    exact: int


class InsertResult(NamedTuple):
    """The node that ends the inserted path and the caller's slots that were duplicates."""

    node: Node
    duplicate_slots: torch.Tensor


def _common_length(a: Sequence[int], a_start: int, b: Sequence[int], limit: int) -> int:
    n = 0
    limit = min(len(a) - a_start, len(b), limit)
    while n < limit and a[a_start + n] == b[n]:
        n += 1
    return n


class RadixCache:
    """Prefix tree over token ids with namespaces and LRU eviction of unlocked leaves."""

    def __init__(self) -> None:
        self._clock = itertools.count()
        self.root = Node([], _EMPTY, None, ("root",), next(self._clock))
        self.root.locks = 1  # never evicted
        self._leaves: set[Node] = set()

    # -- walking ----------------------------------------------------------------------------------
    def _split(self, node: Node, at: int) -> Node:
        """Split ``node`` so that its first ``at`` tokens form a new parent; return that parent."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = Node(node.key[:at], node.slots[:at], parent, node.ns, node.last_used)
        head.locks = node.locks
        parent.children[(head.ns, head.key[0])] = head
        node.key, node.slots = node.key[at:], node.slots[at:]
        node.parent = head
        head.children[(node.ns, node.key[0])] = node
        return head

    def _candidates(self, node: Node, token: int, scope: CacheScope, forced: Namespace | None) -> list[Node]:
        if forced is not None:
            child = node.children.get((forced, token))
            return [child] if child is not None else []
        names = [node.ns] if node.private else [exact_ns(scope), private_ns(scope)]
        return [c for ns in names if ns is not None and (c := node.children.get((ns, token))) is not None]

    def _walk(self, tokens: Sequence[int], scope: CacheScope, exact: int | None) -> MatchResult:
        """Follow ``tokens`` down the tree. ``exact=None``: any allowed namespace (a match);
        otherwise the namespace is forced by depth (an insert: exact below ``exact``)."""
        node, pos, parts, exact_len = self.root, 0, [], None
        stamp = next(self._clock)
        while pos < len(tokens):
            forced = None
            limit = len(tokens)
            if exact is not None:
                forced = exact_ns(scope) if pos < exact else private_ns(scope)
                if forced is None:
                    raise ValueError("approximate KV needs a scope with a private tag")
                limit = exact - pos if pos < exact else limit
            options = self._candidates(node, tokens[pos], scope, forced)
            if not options:
                break
            best = max(options, key=lambda c: (_common_length(tokens, pos, c.key, limit), not c.private))
            n = _common_length(tokens, pos, best.key, limit)
            if n < len(best.key):
                best = self._split(best, n)
            best.last_used = stamp
            if best.private and exact_len is None:
                exact_len = pos
            parts.append(best.slots)
            node, pos = best, pos + n
        slots = torch.cat(parts) if parts else _EMPTY
        return MatchResult(pos, slots, node, pos if exact_len is None else exact_len)

    # -- lookup and insertion -----------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], scope: CacheScope = SHARED) -> MatchResult:
        """Longest prefix of ``tokens`` cached in ``scope``'s namespaces (ends on a node)."""
        return self._walk(tokens, scope, None)

    def insert(
        self, tokens: Sequence[int], slots: torch.Tensor, scope: CacheScope = SHARED, exact: int | None = None
    ) -> InsertResult:
        """Insert ``tokens`` -> ``slots``, exact below ``exact`` (default: all), private above.

        Slots of tokens already cached on that path come back as duplicates.
        """
        if len(tokens) != len(slots):
            raise ValueError("tokens and slots differ in length")
        exact = len(tokens) if exact is None else exact
        if exact < len(tokens) and scope.private is None:
            raise ValueError("approximate KV needs a scope with a private tag")
        match = self._walk(tokens, scope, exact)
        dup = slots[: match.length]
        dup = dup[dup != match.slots]  # the caller may pass the cached slots themselves
        node, pos = match.node, match.length
        while pos < len(tokens):
            ns = exact_ns(scope) if pos < exact else private_ns(scope)
            assert ns is not None
            end = exact if pos < exact else len(tokens)
            leaf = Node(list(tokens[pos:end]), slots[pos:end].clone(), node, ns, next(self._clock))
            node.children[(ns, leaf.key[0])] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            node, pos = leaf, end
        return InsertResult(node, dup)

    def path_slots(self, node: Node) -> torch.Tensor:
        """Slots of the whole path from the root to ``node``."""
        parts = []
        while node.parent is not None:
            parts.append(node.slots)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else _EMPTY

    # -- locking and eviction ---------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Protect the path root..node from eviction."""
        cur: Node | None = node
        while cur is not None:
            cur.locks += 1
            cur = cur.parent

    def unlock(self, node: Node) -> None:
        """Release one ``lock`` of the path root..node."""
        cur: Node | None = node
        while cur is not None:
            if cur.locks <= 0:
                raise RuntimeError("unbalanced unlock")
            cur.locks -= 1
            cur = cur.parent

    def _nodes(self) -> Iterator[Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable_tokens(self) -> int:
        """Tokens held by unlocked nodes."""
        return sum(len(n.key) for n in self._nodes() if n.locks == 0)

    def evict(self, n: int) -> torch.Tensor:
        """Evict LRU unlocked leaves until ``n`` slots are freed; return the freed slots."""
        if n <= 0:
            return _EMPTY
        heap = [(leaf.last_used, id(leaf), leaf) for leaf in self._leaves if leaf.locks == 0]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        count = 0
        while count < n and heap:
            _, _, victim = heapq.heappop(heap)
            parent = victim.parent
            assert parent is not None
            del parent.children[(victim.ns, victim.key[0])]
            self._leaves.discard(victim)
            freed.append(victim.slots)
            count += len(victim.slots)
            if parent is not self.root and not parent.children:
                self._leaves.add(parent)
                if parent.locks == 0:
                    heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return torch.cat(freed) if freed else _EMPTY

    # -- invariants -------------------------------------------------------------------------------
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
        leaves = {n for n in self._nodes() if not n.children and n is not self.root}
        assert leaves == self._leaves, "the leaf set is stale"
        for node in self._nodes():
            assert node.locks >= 0, "negative lock count"
            assert node.locks >= sum(c.locks for c in node.children.values()) or node is self.root
            for (ns, first), child in node.children.items():
                assert child.parent is node and child.key and child.key[0] == first and child.ns == ns
                assert len(child.key) == len(child.slots)
                assert not node.private or child.ns == node.ns, "a private node has a foreign child"
