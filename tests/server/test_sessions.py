"""Sessions: private to their key, bounded by LRU over idle sessions, never refused, TTL."""

from __future__ import annotations

import asyncio

import pytest

from leyline_server.sessions import SessionStore
from tests.server.engine_helpers import engine, prefill


def make_store(**kw):
    eng = engine("tiny-gqa", layers=1)
    released = []
    store = SessionStore(release=lambda h: (released.append(h), eng.release(h)), **kw)
    return eng, store, released


def opened(eng, store, owner, tokens):
    session = store.open(owner, None)
    session.handle = prefill(eng, tokens, scope=session.scope)[0]
    return session


def test_sessions_are_private_to_their_owner():
    eng, store, _ = make_store()
    s = opened(eng, store, "key-a", [10, 11, 12])
    assert len(s.id) >= 24 and store.get(s.id, "key-a") is s
    assert s.scope.private == s.id
    assert store.get(s.id, "key-b") is None and store.get("nope", "key-a") is None
    assert not store.delete(s.id, "key-b")
    assert store.delete(s.id, "key-a") and store.get(s.id, "key-a") is None
    eng.check_integrity()


def test_over_the_cap_the_least_recently_used_idle_session_goes():
    eng, store, released = make_store(max_per_key=2, max_sessions=2)
    a = opened(eng, store, "k", [10, 11])
    b = opened(eng, store, "k", [20, 21])
    b_handle = b.handle
    store.get(a.id, "k")  # a is now more recent than b
    c = opened(eng, store, "k", [30, 31])  # b goes
    assert released == [b_handle] and b.handle is None
    assert store.get(b.id, "k") is None and store.get(a.id, "k") is a and store.get(c.id, "k") is c
    other = opened(eng, store, "other", [40, 41])  # the server cap (2) drops the oldest idle: a
    assert len(store) == 2 and store.get(a.id, "k") is None and store.get(other.id, "other") is other
    assert eng.radix.evictable_tokens() > 0  # released paths became ordinary evictable cache
    eng.check_integrity()


async def test_a_session_in_use_is_never_dropped():
    eng, store, _ = make_store(max_per_key=1)
    busy = opened(eng, store, "k", [10, 11])
    async with store.use(busy):
        newcomer = opened(eng, store, "k", [20, 21])  # over the cap: served anyway
        assert store.get(busy.id, "k") is busy and len(store) == 2
    third = opened(eng, store, "k", [30, 31])  # now both idle ones go
    assert store.get(busy.id, "k") is None and store.get(newcomer.id, "k") is None
    assert store.get(third.id, "k") is third


async def test_use_serialises_requests_on_one_session():
    _, store, _ = make_store()
    session = store.open(None, None)
    order = []

    async def request(tag):
        async with store.use(session):
            order.append(f"{tag}+")
            await asyncio.sleep(0.01)
            order.append(f"{tag}-")

    await asyncio.gather(request("a"), request("b"))
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


def test_idle_sessions_expire():
    now = [0.0]
    eng, store, released = make_store(ttl_s=10, clock=lambda: now[0])
    a = opened(eng, store, None, [10, 11])
    now[0] = 11.0
    assert store.get(a.id, None) is None and len(released) == 1
    with pytest.raises(ValueError):
        SessionStore(release=print, ttl_s=0)


def test_a_thousand_sessions_on_one_key_are_never_refused():
    eng, store, _ = make_store(max_per_key=64)
    for i in range(1000):
        opened(eng, store, "k", [10 + i % 500, 11])
    assert len(store) == 64 and store.dropped == 1000 - 64
    eng.check_integrity()
