"""``leyline.timings``: where a turn's time to its first token went (the real app, in process).

Oracles: the parts add up to the server's ``total``; that total fits inside the client's own
clock around the request; a splice's part is there only when a splice ran.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from leyline_server.api.timings import Clock
from tests.e2e.server_helpers import make_service

MODEL = "tiny-gqa"
PARTS = ("admit", "render", "constrain", "reserve", "queue", "splice", "prefill", "compile", "first_token")


@pytest.fixture(scope="module")
def http():
    from leyline_server.api.app import create_app

    with TestClient(create_app(make_service(MODEL, kv_budget_mb=8))) as client:
        yield client


def _chat(http: TestClient, messages: list[dict], leyline: dict) -> tuple[dict, float]:
    started = time.perf_counter()
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0, "leyline": leyline}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["leyline"], (time.perf_counter() - started) * 1e3


def test_the_parts_add_up_to_the_total_inside_the_clients_clock(http):
    first, outside = _chat(http, [{"role": "user", "content": "count to three " * 20}], {})
    t = first["timings"]
    assert set(t) == {*PARTS, "total"}
    assert all(v >= 0 for v in t.values())
    assert abs(sum(t[p] for p in PARTS) - t["total"]) < 1.0
    assert 0 < t["total"] <= outside and t["prefill"] > 0 and t["splice"] < 1.0  # no splice asked


async def test_the_engine_reports_its_queue_splice_and_prefill():
    from leyline_sdk.core.directives import Directive
    from leyline_server.contract.values import CacheScope, SpliceRequest
    from leyline_server.engines.embedded.serving import AsyncEmbeddedEngine
    from tests.server.engine_helpers import engine

    front = AsyncEmbeddedEngine(engine("tiny-gqa", layers=2))
    scope = CacheScope(private="s")
    base = list(range(10, 70))
    plain = await front.start_turn(base, scope, None, None)
    assert plain.timings["splice"] < 0.5 and plain.timings["prefill"] > 0 and plain.timings["queue"] >= 0
    prompt = base[:5] + [7, 7] + base[20:] + [99]
    request = SpliceRequest([Directive(start=5, end=20, replacement=[7, 7])], prompt=prompt)
    spliced = await front.start_turn(prompt, scope, plain.handle, request)
    assert spliced.report is not None and spliced.report.rotated_tokens > 0
    assert spliced.timings["splice"] > 0 and spliced.timings["prefill"] > 0
    front.release(spliced.handle)
    await front.close()


def test_the_clock_splits_the_engines_share_out_of_the_turn():
    clock = Clock()
    clock.parts.update({"admit": 1.0, "render": 2.0, "constrain": 0.5, "turn": 10.0})
    out = clock.turn_timings({"queue": 1.0, "splice": 3.0, "prefill": 4.0})
    assert out == {"admit": 1.0, "render": 2.0, "constrain": 0.5, "reserve": 2.0, "queue": 1.0, "splice": 3.0,
                   "prefill": 4.0}  # fmt: skip
