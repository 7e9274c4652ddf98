"""The stored responses' bounds, against a naive model of them: per key in count, tokens and bytes, least
recently used first out, idle ones expired, another key's invisible."""

from __future__ import annotations

import pytest

from leyline_server.api.responses_api.store import ResponseStore, StoredResponse


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stored(rid: str, owner: str | None, tokens: int = 10) -> StoredResponse:
    item = {"type": "message", "id": f"item_{rid}", "role": "user", "content": []}
    return StoredResponse(rid, owner, {"id": rid, "output": []}, [item], [], tokens)


def test_count_bound_drops_the_least_recently_used_of_that_key_only():
    store = ResponseStore(max_per_key=3, clock=Clock())
    for i in range(3):
        store.put(stored(f"a{i}", "ka"))
    store.put(stored("b0", "kb"))
    assert store.get("a0", "ka") is not None  # a0 touched: a1 is now the least recently used
    store.put(stored("a3", "ka"))
    assert store.get("a1", "ka") is None
    assert {r for r in ("a0", "a2", "a3") if store.get(r, "ka")} == {"a0", "a2", "a3"}
    assert store.get("b0", "kb") is not None and store.dropped == 1


def test_token_bound_and_a_response_larger_than_it_is_kept_alone():
    store = ResponseStore(max_tokens_per_key=100, clock=Clock())
    store.put(stored("a0", "ka", 60))
    store.put(stored("a1", "ka", 30))
    store.put(stored("a2", "ka", 30))  # 120 > 100: a0 goes
    assert store.get("a0", "ka") is None and store.get("a1", "ka") and store.get("a2", "ka")
    store.put(stored("big", "ka", 500))  # over the bound by itself: the others go, it stays
    assert store.get("big", "ka") is not None and store.get("a1", "ka") is None and len(store) == 1


def test_idle_responses_expire_and_use_keeps_them():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put(stored("a0", "ka"))
    store.put(stored("a1", "ka"))
    clock.now = 8
    assert store.get("a0", "ka") is not None
    clock.now = 15
    assert store.get("a1", "ka") is None and store.get("a0", "ka") is not None


def test_another_keys_response_and_items_are_invisible():
    store = ResponseStore(clock=Clock())
    store.put(stored("a0", "ka"))
    assert store.get("a0", "kb") is None and store.delete("a0", "kb") is False
    assert store.item("kb")("item_a0") is None and store.item("ka")("item_a0") is not None
    assert store.delete("a0", "ka") is True and store.get("a0", "ka") is None


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        ResponseStore(max_per_key=0)


def test_byte_bound_counts_what_is_kept():
    store = ResponseStore(max_bytes_per_key=1000, clock=Clock())
    for i in range(3):
        big = stored(f"a{i}", "ka")
        big.input_items[0]["junk"] = "x" * 300  # about 400 bytes each, kept whole
        store.put(big)
    assert store.get("a0", "ka") is None and store.get("a1", "ka") and store.get("a2", "ka")
    assert 600 < store.bytes_of("ka") <= 1000 and store.bytes_of("kb") == 0


def test_a_reference_is_not_an_item_and_expired_items_are_gone():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put(stored("a0", "ka"))
    later = stored("a1", "ka")
    later.input_items = [{"type": "item_reference", "id": "item_a0"}]
    store.put(later)
    assert store.item("ka")("item_a0") == stored("a0", "ka").input_items[0]  # not the reference
    find = store.item("ka")
    clock.now = 11
    assert find("item_a0") is None  # a lookup made before the response expired does not find it after
    assert store.item("ka")("item_a0") is None and len(store) == 0
