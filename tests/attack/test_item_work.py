"""Round three: a Responses or Messages request's per-item work is bounded and off the event loop.

Findings of issue 44, each a test (both CPU engines):

1. a stored ``reasoning`` item (~250k characters of ``encrypted_content``, not rendered) referenced
   8,000 times was decoded again for every reference, on the event loop (7.9 s of frozen
   ``/health`` for 20,000); 3,000 (reasoning, assistant) reference pairs held a decoded copy each
   (+721 MB) before the 400. Now each stored item is decoded once per request, the conversion
   runs on a thread after the count check, and a conversation past the character budget is a 400
   as soon as the budget is passed;
6. an ``item_reference`` stored by a later response shadowed the item it names: a third reference
   to it was a 404;
7. an expired response's items still resolved;
10. ``--max-messages`` was checked after O(N) work on the event loop (100,000 messages: 1–1.4 s of
    frozen ``/health`` before the 400), and a stream that failed after its 200 was counted as 200
    in ``leyline_requests_total``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from leyline_sdk.core.responses_items import seal
from tests.attack.helpers import MODEL, serve, service

BIG_REASONING = seal("thinking " * 28_000)  # ~250k characters of reasoning, ~336k sealed


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def create(items: list[dict[str, Any]] | str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": items, "max_output_tokens": 2, "temperature": 0, **fields}


async def _health_while(c: httpx.AsyncClient, request: Any) -> tuple[httpx.Response, float, float]:
    """Send ``request`` (a coroutine), and measure ``/health`` while it is being worked on: (its
    answer, the slowest ``/health`` seen, the seconds the request took)."""
    started = time.perf_counter()
    task = asyncio.create_task(request)
    slowest = 0.0
    while not task.done():
        t = time.perf_counter()
        health = await c.get("/health")
        assert health.status_code == 200
        slowest = max(slowest, time.perf_counter() - t)
        await asyncio.sleep(0.05)
    return await task, slowest, time.perf_counter() - started


async def test_a_big_reasoning_item_referenced_thousands_of_times_is_cheap(engine):
    with serve(service(engine, max_body_bytes=16 * 2**20)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            stored = await c.post("/v1/responses", json=create([
                user("remember"), {"type": "reasoning", "id": "rs_big", "summary": [],
                                   "encrypted_content": BIG_REASONING}]))  # fmt: skip
            assert stored.status_code == 200, stored.text
            refs = [{"type": "item_reference", "id": "rs_big"}] * 8000 + [user("again")]
            r, slowest, took = await _health_while(c, c.post("/v1/responses", json=create(refs)))
            assert r.status_code == 200, r.text  # the dangling reasoning is not rendered: a short turn
            assert took < 3.0 and slowest < 0.5, (took, slowest)
            pairs: list[dict[str, Any]] = []
            for i in range(3000):
                pairs += [{"type": "item_reference", "id": "rs_big"}, {"type": "message", "role": "assistant",
                                                                       "content": f"answer {i}"}]  # fmt: skip
            r, slowest, took = await _health_while(c, c.post("/v1/responses", json=create([*pairs, user("x")])))
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert took < 3.0 and slowest < 0.5, (took, slowest)


async def test_an_item_referenced_by_a_stored_response_still_resolves(engine):
    with serve(service(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            first = await c.post("/v1/responses", json=create([{**user("the item"), "id": "msg_named"}]))
            assert first.status_code == 200, first.text
            ref = {"type": "item_reference", "id": "msg_named"}
            for _ in range(3):  # each response stores the reference among its input items
                r = await c.post("/v1/responses", json=create([ref, user("and then")]))
                assert r.status_code == 200, r.text
            items = (await c.get(f"/v1/responses/{r.json()['id']}/input_items", params={"order": "asc"})).json()
            assert items["data"][0] == ref  # the input as it was sent


async def test_an_expired_responses_items_do_not_resolve(engine):
    with serve(service(engine, responses_ttl_s=1.0)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            first = await c.post("/v1/responses", json=create([{**user("old"), "id": "msg_old"}]))
            assert first.status_code == 200, first.text
            await asyncio.sleep(1.3)
            r = await c.post("/v1/responses", json=create([{"type": "item_reference", "id": "msg_old"}]))
            assert r.status_code == 404 and r.json()["error"]["code"] == "item_not_found", r.text
            assert (await c.get(f"/v1/responses/{first.json()['id']}")).status_code == 404


async def test_too_many_messages_are_refused_before_any_work(engine):
    with serve(service(engine, max_body_bytes=16 * 2**20)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            many = [{"role": "user", "content": "x"}] * 100_000
            bodies = {
                "/v1/messages": {"model": MODEL, "max_tokens": 2, "messages": many},
                "/v1/messages/count_tokens": {"model": MODEL, "messages": many},
                "/v1/responses": create(many),
            }
            for path, body in bodies.items():
                r, slowest, took = await _health_while(c, c.post(path, json=body))
                assert r.status_code == 400, (path, r.text)
                assert "too_many_messages" in r.text, (path, r.text)
                assert slowest < 0.4, (path, slowest, took)


def _requests_total(metrics: str, route: str) -> dict[str, float]:
    prefix = f'leyline_requests_total{{route="{route}",status="'
    out = {}
    for line in metrics.splitlines():
        if line.startswith(prefix):
            status, value = line[len(prefix) :].split('"}')
            out[status] = float(value)
    return out


async def test_a_stream_that_fails_after_its_200_is_counted_as_failed(engine):
    with serve(service(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            long = create("word " * 5000, stream=True)  # past the context: response.failed in the stream
            async with c.stream("POST", "/v1/responses", json=long) as r:
                assert r.status_code == 200
                text = "".join([chunk async for chunk in r.aiter_text()])
            assert "response.failed" in text and "context_length_exceeded" in text
            counted = _requests_total((await c.get("/metrics")).text, "/v1/responses")
    assert counted == {"400": 1.0}, counted
