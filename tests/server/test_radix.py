"""Radix prefix cache: matching, splitting, duplicates, namespaces, locking, LRU eviction, integrity."""

from __future__ import annotations

import random

import pytest
import torch

from leyline_server.contract.values import CacheScope
from leyline_server.engines.embedded.radix import RadixCache


def slots(*xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_match_insert_and_split():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    m = tree.match_prefix([1, 2, 9])
    assert m.length == 2 and m.slots.tolist() == [10, 11] and m.exact == 2
    r = tree.insert([1, 2, 5], slots(10, 11, 20))
    assert r.duplicate_slots.numel() == 0
    r = tree.insert([1, 2, 5, 6], slots(30, 31, 32, 33))  # first three already cached
    assert r.duplicate_slots.tolist() == [30, 31, 32]
    assert tree.path_slots(r.node).tolist() == [10, 11, 20, 33]
    assert sorted(tree.owned_slots()) == [10, 11, 12, 13, 20, 33]
    tree.check_integrity(34, set(range(34)) - {10, 11, 12, 13, 20, 33})


def test_private_kv_is_matched_only_by_its_own_scope():
    tree = RadixCache()
    mine = CacheScope(private="s1")
    tree.insert([1, 2, 3, 4, 5], slots(0, 1, 2, 3, 4), mine, exact=2)  # [3, 4, 5] approximate
    own = tree.match_prefix([1, 2, 3, 4, 5, 6], mine)
    assert own.length == 5 and own.exact == 2
    plain = tree.match_prefix([1, 2, 3, 4, 5, 6])
    assert plain.length == 2 and plain.slots.tolist() == [0, 1]  # up to the last exact token
    other = tree.match_prefix([1, 2, 3, 4, 5, 6], CacheScope(private="s2"))
    assert other.length == 2
    # a plain request computes the same tokens exactly: both paths coexist
    r = tree.insert([1, 2, 3, 4, 5], slots(0, 1, 12, 13, 14))
    assert r.duplicate_slots.tolist() == [] and tree.match_prefix([1, 2, 3, 4, 5]).slots.tolist() == [0, 1, 12, 13, 14]
    assert tree.match_prefix([1, 2, 3, 4, 5], mine).length == 5
    tree.check_integrity(15, set(range(5, 12)))


def test_salts_partition_exact_kv():
    tree = RadixCache()
    a, b = CacheScope(salt="a"), CacheScope(salt="b")
    tree.insert([1, 2, 3], slots(0, 1, 2), a)
    assert tree.match_prefix([1, 2, 3], a).length == 3
    assert tree.match_prefix([1, 2, 3], b).length == 0 and tree.match_prefix([1, 2, 3]).length == 0
    with pytest.raises(ValueError, match="private"):
        tree.insert([7, 8], slots(5, 6), b, exact=1)  # approximate KV needs a private tag


def test_lru_eviction_skips_locked_paths():
    tree = RadixCache()
    tree.insert([1, 2, 3], slots(0, 1, 2))
    b = tree.insert([1, 2, 7, 8], slots(0, 1, 3, 4)).node
    tree.insert([5, 6], slots(5, 6))
    tree.lock(b)
    tree.match_prefix([5, 6])  # used most recently
    assert tree.evict(1).tolist() == [2]  # the least recently used unlocked leaf
    assert sorted(tree.evict(10).tolist()) == [5, 6]  # b's path is locked
    tree.unlock(b)
    assert sorted(tree.evict(10).tolist()) == [0, 1, 3, 4]
    assert tree.evict(0).numel() == 0
    tree.check_integrity(7, set(range(7)))


def test_unbalanced_unlock_and_broken_invariants_are_caught():
    tree = RadixCache()
    node = tree.insert([1, 2], slots(0, 1)).node
    with pytest.raises(RuntimeError):
        tree.unlock(node)
    with pytest.raises(AssertionError):
        tree.check_integrity(3, {1, 2})  # slot 1 free and owned
    with pytest.raises(AssertionError):
        tree.check_integrity(4, {2})  # slot 3 lost


def test_eviction_order_is_least_recently_used_against_a_naive_oracle():
    rng = random.Random(7)
    tree = RadixCache()
    used: dict[int, int] = {}  # leaf id (its first token) -> time of last use
    for clock in range(200):
        first = rng.randrange(60)
        if first in used and rng.random() < 0.5:
            tree.match_prefix([1000 + first, first])
        else:
            tree.insert([1000 + first, first], slots(2 * first, 2 * first + 1))
        used[first] = clock
    # every path shares no prefix (distinct first tokens), so each is one leaf; evict one by one
    order = []
    while True:
        freed = tree.evict(1)
        if not freed.numel():
            break
        order.append(int(freed[0]) // 2)
    assert order == sorted(used, key=used.__getitem__)
