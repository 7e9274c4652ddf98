"""Round two: one request's schema work must not freeze the server for everyone.

A chat request with a 1.3 MB ``response_format`` schema (20,000 ``$defs``: its validation alone
took ~13 s on the event loop) is in flight; meanwhile ``/health`` and another client's short chat
must answer. The bounds catch a freeze, not a slowdown: ``/health`` within 2 s (8.3 s before the
fix; 0.06 s after), the short chat within 5 s (its render and prefill share the interpreter with
the schema check: 0.1 s on a quiet machine, 2.7 s with a second test run beside it).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.attack.helpers import MODEL, serve, service


def huge_schema(defs: int = 20_000) -> dict:
    shapes = {f"d{i}": {"type": "object", "properties": {"a": {"type": "integer"}}} for i in range(defs)}
    return {"$defs": shapes, "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}}


async def test_a_huge_schema_does_not_freeze_health_or_another_chat(engine):
    fmt = {"type": "json_schema", "json_schema": {"name": "huge", "schema": huge_schema()}}
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "response_format": fmt}
    short = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with serve(service(engine, max_body_bytes=16 * 2**20)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            assert (await c.post("/v1/chat/completions", json=short)).status_code == 200  # warm
            slow = asyncio.create_task(c.post("/v1/chat/completions", json=huge))
            await asyncio.sleep(1.0)  # the huge request is being read, then checked
            started = time.perf_counter()
            assert (await c.get("/health")).status_code == 200
            health = time.perf_counter() - started
            started = time.perf_counter()
            assert (await c.post("/v1/chat/completions", json=short)).status_code == 200
            chat = time.perf_counter() - started
            assert not slow.done(), "the huge schema was handled within a second: nothing was measured"
            answer = await slow
            assert answer.status_code < 500, answer.text
    assert health < 2.0 and chat < 5.0, (health, chat)
