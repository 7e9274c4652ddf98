"""One key cannot starve another (finding 7), and unread streams do not hold the pool forever.

Key A opens seven long streams and stops reading them (small socket buffers, as on a slow link,
so the server's writes block after ~100 KB). Key B's long request is then served at once: A's
streams reserve at most A's share of the KV pool, and A's extra streams wait for A's own. The
paused streams end after the stall timeout with their tokens committed.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx

from tests.attack.helpers import KEYS, MODEL, auth, serve, service

STALL_S = 4.0
WORDS = " ".join(f"w{i % 97}" for i in range(900))  # a ~1,900-token prompt on the tiny tokenizer


def _slow_reader(url: str, key: str) -> httpx.AsyncClient:
    """A client whose sockets take 4 KB and then stop (it never reads the streams it opens)."""
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=120, headers=auth(key))


def _body(i: int, max_tokens: int, stream: bool = True) -> dict:
    content = f"stream {i}: {WORDS}"
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, "leyline": {}}  # fmt: skip


async def _open(client: httpx.AsyncClient, body: dict) -> httpx.Response:
    return await client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)


async def test_unread_streams_of_one_key_do_not_starve_another(engine):
    svc = service(engine, api_keys=frozenset(KEYS), stream_stall_timeout_s=STALL_S, admission_timeout_s=60)
    capacity = svc.engine.info.kv_capacity_tokens
    with serve(svc, send_buffer=8192) as url:
        async with _slow_reader(url, "key-a") as a, httpx.AsyncClient(base_url=url, timeout=120) as b:
            streams = [asyncio.create_task(_open(a, _body(i, 1000))) for i in range(7)]
            await asyncio.sleep(1.0)  # A's first streams run and stall; the rest wait for A's share
            reserved_a = svc.admission.in_flight("key-a")[1]
            assert 0 < reserved_a <= capacity // 2, (reserved_a, capacity)
            started = time.perf_counter()
            long_prompt = [{"role": "user", "content": f"{WORDS} {WORDS}"}]  # ~3,700 tokens: a fifth of the pool
            body = {**_body(99, 4, stream=False), "messages": long_prompt}
            r = await b.post("/v1/chat/completions", json=body, headers=auth("key-b"))
            waited, a_running = time.perf_counter() - started, svc.admission.in_flight("key-a")[0]
            assert r.status_code == 200, r.text  # never another key's 503
            assert a_running > 0, f"B waited {waited:.1f} s: for A's streams to end"  # served beside them
            responses = await asyncio.gather(*streams)
            for response in responses:
                assert response.status_code in (200, 429), response.status_code
                if response.status_code == 429:
                    assert int(response.headers["retry-after"]) >= 1
            assert any(response.status_code == 200 for response in responses)
            deadline = time.time() + 60
            while svc.admission.in_flight("key-a")[0] and time.time() < deadline:
                await asyncio.sleep(0.2)  # every A stream ends while still open: stalled, after the timeout
            assert svc.admission.in_flight("key-a") == (0, 0) and svc.admission.reserved == 0
            for response in responses:  # (closed only now: a client that leaves ends its stream sooner)
                await response.aclose()
        kept = [s for s in svc.sessions.owned_by("key-a") if s.handle is not None]
        assert kept, "the stalled streams' sessions keep what they generated"
        prompts = [svc.chat.render([{"role": "user", "content": f"stream {i}: {WORDS}"}]).tokens for i in range(7)]
        generated = [_generated(session.tokens, prompts) for session in kept]
        assert max(generated) < 1000, generated  # paused mid-way: no stream ran to its end
        assert min(generated) >= 0 and sum(n > 100 for n in generated) >= 2, generated  # stalled ones kept theirs


def _generated(tokens: list[int], prompts: list[list[int]]) -> int:
    """How many tokens a session holds past its own stream's prompt (-1: it holds no stream's prompt)."""
    own = [p for p in prompts if tokens[: len(p)] == p]
    return len(tokens) - len(own[0]) if own else -1


async def test_a_key_at_its_concurrency_limit_waits_then_gets_429_with_retry_after(engine):
    svc = service(
        engine, api_keys=frozenset(KEYS), max_concurrent_per_key=2, admission_timeout_s=1.0, stream_stall_timeout_s=30
    )
    with serve(svc, send_buffer=8192) as url:
        async with _slow_reader(url, "key-a") as a, httpx.AsyncClient(base_url=url, timeout=60) as b:
            held = [await _open(a, _body(i, 1000)) for i in range(2)]
            assert all(r.status_code == 200 for r in held)
            started = time.perf_counter()
            r = await b.post("/v1/chat/completions", json=_body(3, 2, stream=False), headers=auth("key-a"))
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
            assert r.headers["retry-after"] == "1" and time.perf_counter() - started >= 0.9
            r = await b.post("/v1/chat/completions", json=_body(4, 2, stream=False), headers=auth("key-b"))
            assert r.status_code == 200, r.text  # the other key is not affected
            for response in held:
                await response.aclose()  # the client goes away: its slots come back
            await asyncio.sleep(0.5)
            r = await b.post("/v1/chat/completions", json=_body(5, 2, stream=False), headers=auth("key-a"))
            assert r.status_code == 200, r.text
