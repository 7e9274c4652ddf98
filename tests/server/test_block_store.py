"""The block store: owner-scoped, LRU-dropped past its caps, never releasing a block a request holds."""

from __future__ import annotations

from leyline_server.blocks import BlockStore
from leyline_server.contract.values import CacheScope, Handle


def handle(n: int) -> Handle:
    return Handle(list(range(n)), n, n, CacheScope())


def test_caps_drop_the_owners_oldest_blocks_only():
    released = []
    store = BlockStore(released.append, max_per_key=3, max_tokens_per_key=100)
    a = [store.add(f"a{i}", "a", handle(30)) for i in range(3)]
    b = store.add("b0", "b", handle(90))
    store.add("a3", "a", handle(30))  # four blocks of 30: past both of a's caps
    assert released == [a[0].handle] and store.get("a0", "a") is None
    assert store.get("b0", "a") is None and store.get("b0", "b") is b  # another key's block is invisible
    store.add("a4", "a", handle(70))  # 30 + 30 + 30 + 70 tokens: the oldest go until it fits
    assert released == [a[0].handle, a[1].handle, a[2].handle]


def test_a_block_dropped_while_a_request_holds_it_is_released_after():
    released = []
    store = BlockStore(released.append)
    block = store.add("x", "k", handle(10))
    with store.using(["x", "missing", None], "k") as named:
        assert named == {"x": block.handle}
        store.drop(block)
        assert released == [] and store.get("x", "k") is None  # gone for new requests, still pinned
        with store.using(["x"], "k") as again:
            assert again == {}
    assert released == [block.handle]
    store.drop(block)  # dropping twice releases once
    assert released == [block.handle]
