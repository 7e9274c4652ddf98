"""Fair admission on its own: slots, reservations, shares, FIFO waits, 429s, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from leyline_server.api.admission import Admission
from leyline_server.api.errors import APIError


def admission(capacity=1000, concurrent=4, share=0.5, timeout=0.2) -> Admission:
    return Admission(capacity, concurrent, share, timeout)


async def test_a_lone_key_may_start_one_request_of_any_size_then_keeps_to_its_share():
    adm = admission()
    async with adm.slot("a") as first:
        await adm.reserve(first, 900)  # over the share of 500: the key's first request is never refused
        assert adm.in_flight("a") == (1, 900)
        async with adm.slot("a") as second:
            with pytest.raises(APIError) as info:
                await adm.reserve(second, 10)
            assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
    assert adm.in_flight("a") == (0, 0) and adm.reserved == 0


async def test_the_share_shrinks_with_active_keys_and_another_key_is_never_refused_for_it():
    adm = admission(share=1.0)
    async with adm.slot("a") as a1, adm.slot("a") as a2:
        await adm.reserve(a1, 300)
        await adm.reserve(a2, 300)  # alone: the whole pool is its share
        assert adm.key_share() == 1000
        async with adm.slot("b") as b:
            assert adm.key_share() == 500  # two keys active
            await adm.reserve(b, 400)  # fits the room left
            async with adm.slot("a") as a3:
                with pytest.raises(APIError):
                    await adm.reserve(a3, 10)  # a holds 600 > its share now


async def test_a_waiter_is_granted_when_room_comes_back_in_arrival_order():
    adm = admission(capacity=100, share=1.0, timeout=5)
    order = []

    async def hold(key, tokens, release: asyncio.Event):
        async with adm.slot(key) as t:
            await adm.reserve(t, tokens)
            order.append(key)
            await release.wait()

    done = asyncio.Event()
    big = asyncio.create_task(hold("a", 90, done))
    await asyncio.sleep(0.01)
    long_wait = asyncio.create_task(hold("b", 60, asyncio.Event()))  # blocked by room
    await asyncio.sleep(0.01)
    small = asyncio.create_task(hold("c", 5, asyncio.Event()))  # would fit, but queues behind b
    await asyncio.sleep(0.05)
    assert order == ["a"] and adm.waiting == 2
    done.set()
    await asyncio.sleep(0.05)
    assert order == ["a", "b", "c"]  # the long request was not starved by the short one
    for task in (big, long_wait, small):
        task.cancel()
    await asyncio.gather(big, long_wait, small, return_exceptions=True)
    assert adm.reserved == 0 and adm.waiting == 0


async def test_slots_per_key_and_cancellation_gives_everything_back():
    adm = admission(concurrent=1, timeout=5)
    async with adm.slot("a"):
        waiter = asyncio.create_task(adm.slot("a").__aenter__())
        await asyncio.sleep(0.01)
        assert adm.waiting == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.waiting == 0
        async with adm.slot("b"):  # another key is not limited by a's slots
            pass
    assert adm.in_flight("a") == (0, 0)
    quick = admission(concurrent=1, timeout=0)
    async with quick.slot("a"):
        with pytest.raises(APIError) as info:
            async with quick.slot("a"):
                pass
        assert info.value.status == 429 and "requests of this key in flight" in info.value.message


def test_bad_settings_are_refused():
    for bad in ({"capacity": 0}, {"concurrent": 0}, {"share": 0}, {"share": 1.5}, {"timeout": -1}):
        with pytest.raises(ValueError):
            admission(**bad)


async def test_a_running_request_grows_its_reservation_without_waiting_and_newcomers_wait_for_room():
    adm = admission(capacity=1000, share=1.0, timeout=5)

    async def late() -> int:
        async with adm.slot("b") as ticket:
            await adm.reserve(ticket, 50)
            return adm.reserved

    async with adm.slot("a") as first:
        async with adm.slot("a") as second:
            await adm.reserve(first, 400)
            await adm.reserve(second, 400)
            adm.grow(first, 300)  # past the pool: its tokens are being generated, nothing waits for them
            assert adm.reserved == 1100 and adm.in_flight("a") == (2, 1100)
            waiting = asyncio.create_task(late())  # a newcomer waits for room
            await asyncio.sleep(0.05)
            assert not waiting.done() and adm.waiting == 1
        assert await asyncio.wait_for(waiting, 1) == 750  # room came back with the second's end: granted
    assert adm.reserved == 0 and adm.in_flight("a") == (0, 0)
