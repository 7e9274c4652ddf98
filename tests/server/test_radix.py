"""Radix prefix cache: matching, splitting, duplicates, locking, LRU eviction, integrity."""

from __future__ import annotations

import pytest
import torch

from leyline_server.engines.embedded.radix import RadixCache


def slots(*xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_match_insert_and_split():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
    m = tree.match_prefix([1, 2, 9])
    assert m.length == 2 and m.slots.tolist() == [10, 11]
    r = tree.insert([1, 2, 5], slots(10, 11, 20))
    assert r.duplicate_slots.numel() == 0
    r = tree.insert([1, 2, 5, 6], slots(30, 31, 32, 33))  # first three already cached
    assert r.duplicate_slots.tolist() == [30, 31, 32]
    assert tree.path_slots(r.node).tolist() == [10, 11, 20, 33]
    owned = sorted(tree.owned_slots())
    assert owned == [10, 11, 12, 13, 20, 33]
    assert tree.hit_tokens == 2 and tree.requested_tokens == 3


def test_lru_eviction_skips_locked_paths():
    tree = RadixCache()
    a = tree.insert([1, 2, 3], slots(0, 1, 2)).node
    b = tree.insert([1, 2, 7, 8], slots(0, 1, 3, 4)).node
    c = tree.insert([5, 6], slots(5, 6)).node
    tree.lock(b)
    tree.match_prefix([5, 6])  # c used most recently
    freed = tree.evict(1)
    assert freed.tolist() == [2]  # a's leaf is the least recently used unlocked leaf
    freed = tree.evict(10)
    assert sorted(freed.tolist()) == [5, 6]  # b's path is locked
    tree.unlock(b)
    assert sorted(tree.evict(10).tolist()) == [0, 1, 3, 4]
    assert tree.evict(0).numel() == 0
    tree.check_integrity(7, set(range(7)))
    assert a is not c


def test_unbalanced_unlock_and_broken_invariants_are_caught():
    tree = RadixCache()
    node = tree.insert([1, 2], slots(0, 1)).node
    with pytest.raises(RuntimeError):
        tree.unlock(node)
    with pytest.raises(AssertionError):
        tree.check_integrity(3, {1, 2})  # slot 1 free and owned
    with pytest.raises(AssertionError):
        tree.check_integrity(4, {2})  # slot 3 lost
