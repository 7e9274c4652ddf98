"""A serving process's full collections skip what existed before it served (:mod:`leyline_server.api.heap`).

Found by CI: an attack test's ``/health`` stalled 0.85 s while a request was in flight, in a test
process of ~2 million objects, where each oldest-generation collection walked them all (0.3–0.55 s
measured on this machine). The oracle is the collector's own bookkeeping: objects made before the
server started are in no generation while it serves, and back in the oldest after it stops.
"""

from __future__ import annotations

import gc
import weakref

import httpx

from leyline_server.local import local_service, serve_in_thread


class Ballast:
    """An object the collector tracks (instances of plain classes are tracked)."""


def _tracked(objects: list[Ballast]) -> int:
    """How many of ``objects`` any of the collector's generations holds."""
    ids = {id(o) for o in objects}
    return sum(id(o) in ids for o in gc.get_objects())


def test_a_full_collection_while_serving_skips_the_startup_heap():
    ballast = [Ballast() for _ in range(20_000)]
    assert _tracked(ballast) == len(ballast)
    with serve_in_thread(local_service("tiny-gqa")) as url:
        assert gc.get_freeze_count() >= len(ballast)
        assert _tracked(ballast) == 0  # a collection walks none of them
        made_while_serving = [Ballast() for _ in range(1_000)]
        assert _tracked(made_while_serving) == len(made_while_serving)  # new objects are still collected
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert gc.get_freeze_count() == 0
    assert _tracked(ballast) == len(ballast)


def test_two_servers_in_one_process_keep_the_freeze_until_the_last_stops():
    ballast = [Ballast() for _ in range(5_000)]
    with serve_in_thread(local_service("tiny-gqa")):
        with serve_in_thread(local_service("tiny-gqa")):
            assert _tracked(ballast) == 0
        assert _tracked(ballast) == 0
    assert _tracked(ballast) == len(ballast)


def test_cyclic_garbage_made_of_startup_objects_is_reclaimed_once_serving_ends():
    a, b = Ballast(), Ballast()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    gone = weakref.ref(a)
    with serve_in_thread(local_service("tiny-gqa")):
        del a, b
        gc.collect()
        assert gone() is not None  # the price of the freeze: a frozen cycle waits for the last server
    gc.collect()
    assert gone() is None
