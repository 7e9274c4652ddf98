"""Every request's work is bounded before it is admitted (findings 1-3 of the attack).

1. a directive whose result would pass the context is refused before any KV is allocated;
2. rendering runs off the event loop, bounded in messages, characters and time: ``/health``
   answers while a huge request renders;
3. the body limit counts the bytes read (chunked too), and the API key is checked before the
   body is read.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from leyline_sdk.core.directives import digest
from tests.attack.helpers import KEYS, auth, raw_request, serve, service

BASE = list(range(5, 105))  # a 100-token session


async def test_a_directive_result_past_the_context_is_refused_before_any_kv(engine):
    svc = service(engine)
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            sid = (await c.post("/v1/leyline/sessions", json={"tokens": BASE})).json()["id"]
            prefilled = svc.metrics.registry.get_sample_value("leyline_tokens_total", {"kind": "prefilled"}) or 0.0
            started = time.perf_counter()
            huge = {"directives": [{"start": 50, "end": 50, "replacement": [7] * 16384}]}
            r = await c.post(f"/v1/leyline/sessions/{sid}/directives", json=huge)
            assert time.perf_counter() - started < 5
            assert r.status_code == 200, r.text
            body = r.json()
            assert not body["applied"] and body["fallback"]["code"] == "context_length_exceeded"
            assert "directive 0" in body["fallback"]["message"]
            assert body["base"] == {"length": 100, "digest": digest(BASE)}  # the session is untouched
            # eight inserts of 2,000: the second one passes the context, and strict names it
            eight = [{"start": 50 + i, "end": 50 + i, "replacement": [7] * 2000} for i in range(8)]
            r = await c.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": eight, "strict": True})
            assert r.status_code == 422 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert r.json()["error"]["param"] == "directives.1"
            after = svc.metrics.registry.get_sample_value("leyline_tokens_total", {"kind": "prefilled"}) or 0.0
            assert after == prefilled  # nothing was computed
            got = (await c.get(f"/v1/leyline/sessions/{sid}")).json()
            assert got["tokens"] == BASE
            # the same on a chat request: 400 naming the directive
            first = await c.post(
                "/v1/chat/completions",
                json={"model": "tiny-gqa", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                      "leyline": {}},
            )  # fmt: skip
            ext = first.json()["leyline"]
            r = await c.post(
                "/v1/chat/completions",
                json={
                    "model": "tiny-gqa",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1,
                    "leyline": {
                        "session_id": ext["session_id"],
                        "directives": [{"start": 1, "end": 1, "replacement": [9] * 5000}],
                    },
                },
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "context_length_exceeded" and error["param"] == "leyline.directives.0"
            # sessions and blocks: the same limit on what they are opened with
            for path in ("/v1/leyline/sessions", "/v1/leyline/blocks"):
                r = await c.post(path, json={"tokens": [7] * 4097})
                assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert (await c.get("/health")).status_code == 200


async def test_health_answers_while_a_huge_request_renders(engine):
    svc = service(engine, render_timeout_s=3.0)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(2000)]
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            slow = asyncio.create_task(c.post("/v1/leyline/tokenize", json={"messages": many}))
            await asyncio.sleep(0.2)
            worst = 0.0
            while not slow.done():
                started = time.perf_counter()
                assert (await c.get("/health")).status_code == 200
                worst = max(worst, time.perf_counter() - started)
                await asyncio.sleep(0.05)
            r = await slow
            assert r.status_code in (200, 400), r.text
            if r.status_code == 400:
                assert r.json()["error"]["code"] == "render_timeout"
            assert worst < 1.0, f"/health took {worst:.2f} s while a request rendered"
            # past the message bound: refused before anything is rendered
            started = time.perf_counter()
            r = await c.post("/v1/leyline/tokenize", json={"messages": many * 5})
            assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
            assert time.perf_counter() - started < 2
            # a chat prompt renders once (linear): 2,000 messages answer at once, here over the context
            started = time.perf_counter()
            r = await c.post("/v1/chat/completions", json={"model": "tiny-gqa", "messages": many, "max_tokens": 1})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert time.perf_counter() - started < 3
            # characters past the bound: refused before tokenizing
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "tiny-gqa", "messages": [{"role": "user", "content": "x" * 200_000}]},
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


async def test_the_body_limit_counts_bytes_read_chunked_too(engine):
    svc = service(engine, max_body_bytes=1 << 20, api_keys=frozenset(KEYS))
    with serve(svc) as url:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nAuthorization: Bearer key-a\r\n\r\n"
        )
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"  # 64 KiB per chunk
        answer, sent = raw_request(url, head, [chunk] * 1024)  # 64 MiB offered
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < 4 << 20, f"{sent} bytes went in before the 413"
        # without a key: 401 before a byte of the body is read
        head = head.replace(b"Authorization: Bearer key-a\r\n", b"")
        answer, sent = raw_request(url, head, [chunk] * 4096)  # 256 MiB offered
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert sent < 4 << 20, f"{sent} bytes went in before the 401"

        async def body(n: int):
            for _ in range(n):
                yield b" " * 65536

        async with httpx.AsyncClient(base_url=url, timeout=60, headers=auth("key-a")) as c:
            try:
                r = await c.post("/v1/leyline/tokenize", content=body(32))  # 2 MiB, chunked by httpx
                assert r.status_code == 413, r.text
            except httpx.TransportError:
                pass  # the server answered 413 and closed while the client was still sending
            r = await c.post("/v1/leyline/tokenize", content=b"x" * (2 << 20))  # Content-Length
            assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
            small = b'{"messages": [{"role": "user", "content": "hi"}]}'

            async def chunks():
                yield small[:10]
                yield small[10:]

            json_type = {"Content-Type": "application/json"}
            r = await c.post("/v1/leyline/tokenize", content=chunks(), headers=json_type)  # chunked, within the limit
            assert r.status_code == 200, r.text
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for key in ("clé", "ключ", "\u00ff" * 40):
                header = ("Bearer " + key).encode("utf-8")
                for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
                    r = await c.request(method, path, headers={"Authorization": header}, json={})
                    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
            assert (await c.get("/health")).status_code == 200
