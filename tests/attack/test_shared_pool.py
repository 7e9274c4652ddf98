"""Round two: one key's cache must not cost another key its request or its session.

Findings, each a test (both CPU engines, a pool of ~5,000 tokens for a 4,096-token context):

* key A's blocks (up to its cap, a quarter of the pool) made key B's session of a context's
  length fail with 503 ``capacity``: blocks were never shed. Idle blocks are cache now, shed like
  idle sessions;
* A's block creation dropped B's idle session (the oldest anywhere): room is now made from the key
  holding the most idle KV first;
* 130 one-token sessions from A dropped B's idle session at the global ``--max-sessions`` cap:
  the cap now drops from the key with the most sessions;
* ``DELETE`` of a session whose stream nobody reads waited for the stall timeout (69 s): it ends
  the stream and answers at once.

Issue 43: KV is reserved as it is used. Two requests of one key asking ``max_tokens: 32000`` (as
Claude Code does) are both admitted, and a pool too small for two answers retracts one of them,
which still answers exactly what it answers alone.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx

from leyline_server.local import local_service
from tests.attack.helpers import KEYS, MODEL, auth, serve, service

A, B = auth(KEYS[0]), auth(KEYS[1])
POOL_MB = 2.45  # ~5,000 tokens of tiny-gqa's KV in float32: one context (4,096) and a bit


def tokens(n: int, seed: int) -> list[int]:
    return [100 + (seed * 7919 + i * 31) % 900 for i in range(n)]


async def _session(c: httpx.AsyncClient, n: int, seed: int, key: dict) -> httpx.Response:
    return await c.post("/v1/leyline/sessions", json={"tokens": tokens(n, seed)}, headers=key)


async def _block(c: httpx.AsyncClient, n: int, seed: int, key: dict) -> httpx.Response:
    return await c.post("/v1/leyline/blocks", json={"tokens": tokens(n, seed)}, headers=key)


async def _alive(c: httpx.AsyncClient, session_id: str, key: dict) -> bool:
    return (await c.get(f"/v1/leyline/sessions/{session_id}", headers=key)).status_code == 200


async def test_one_keys_blocks_neither_fail_nor_drop_another_keys_sessions(engine):
    svc = service(engine, kv_budget_mb=POOL_MB, kv_cache_dtype="float32", api_keys=frozenset(KEYS))
    pool, context = svc.engine.info.kv_capacity_tokens, svc.context_tokens
    assert context < pool < context + pool // 4 + 400, (pool, context)  # A's blocks and a context do not fit
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            small = await _session(c, 400, 1, B)
            assert small.status_code == 200, small.text
            assert (await _session(c, pool - 400 - 2 * (pool // 9) - 200, 2, A)).status_code == 200
            for seed in range(3):  # A's blocks: the third needs room the pool no longer has free
                r = await _block(c, pool // 9, 10 + seed, A)
                assert r.status_code == 200, r.text
            assert await _alive(c, small.json()["id"], B), "A's block creation dropped B's idle session"
            big = await _session(c, context - 8, 3, B)  # fits the context; needs A's cache gone
            assert big.status_code == 200, big.text
            assert await _alive(c, small.json()["id"], B) or svc.engine.info.parks_idle


async def test_the_global_session_cap_drops_from_the_key_with_the_most_sessions(engine):
    svc = service(engine, api_keys=frozenset(KEYS), max_sessions=128)
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            mine = await _session(c, 390, 5, B)
            assert mine.status_code == 200, mine.text
            for i in range(130):
                assert (await _session(c, 1, 100 + i, A)).status_code == 200
            assert await _alive(c, mine.json()["id"], B), "A's sessions pushed out B's only session"
            assert len(svc.sessions) <= 128


async def test_deleting_a_session_ends_its_unread_stream_at_once(engine):
    svc = service(engine, stream_stall_timeout_s=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 3000,
            "ignore_eos": True, "temperature": 0, "stream": True, "leyline": {}}  # fmt: skip
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    with serve(svc, send_buffer=8192) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120, transport=transport) as reader:
            stream = await reader.send(reader.build_request("POST", "/v1/chat/completions", json=body), stream=True)
            session_id = stream.headers["x-leyline-session"]
            await asyncio.sleep(2.0)  # the server's writes now wait on a client that reads nothing
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                started = time.perf_counter()
                deleted = await c.delete(f"/v1/leyline/sessions/{session_id}")
                took = time.perf_counter() - started
                assert deleted.status_code == 200, deleted.text
                assert not await _alive(c, session_id, {})
                assert (await c.get("/health")).status_code == 200
            await stream.aclose()
    assert took < 5.0, f"DELETE took {took:.1f} s: it waited for the stall timeout"


def _metric(text: str, name: str) -> float:
    """A sample of ``/metrics``."""
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])


async def test_two_requests_of_one_key_asking_32000_tokens_are_both_admitted(engine):
    """Claude Code asks ``max_tokens: 32000``; the key's share is half the pool. Reserving
    prompt + max_tokens admitted one such request and made the second wait, then 429."""
    svc = local_service("tiny-gqa-long", engine=engine, kv_budget_mb=20, max_context_tokens=40000,
                        api_keys=frozenset(KEYS), admission_timeout_s=2.0)  # fmt: skip
    assert svc.context_tokens == 40000 and svc.admission.key_share() < 2 * 32000
    body = {"model": "tiny-gqa-long", "messages": [{"role": "user", "content": "write a long story"}],
            "max_tokens": 32000, "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            request = c.build_request("POST", "/v1/chat/completions", json=body, headers=A)
            both = await asyncio.gather(*(c.send(request, stream=True) for _ in range(2)))
            assert [r.status_code for r in both] == [200, 200]  # both admitted, prefilled, decoding
            requests, reserved = svc.admission.in_flight(KEYS[0])
            assert requests == 2 and reserved < svc.admission.key_share()  # prompts and headroom, not 2 x 32000
            for r in both:
                await r.aclose()
            deadline = time.monotonic() + 5
            while _metric((await c.get("/metrics")).text, "leyline_kv_reserved_tokens") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _metric((await c.get("/metrics")).text, "leyline_kv_reserved_tokens") == 0


async def test_a_pool_too_small_for_two_answers_retracts_one_and_both_answer_as_alone(engine):
    svc = service(engine, kv_budget_mb=0.375 if engine == "embedded" else 0.1875)  # 768 tokens
    cap = svc.engine.info.kv_capacity_tokens
    assert cap == 768, cap  # two prompts and their headroom fit (admitted at once), two answers do not
    prompts = [f"tell me about the number {n}" for n in (17, 4242)]
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:

            async def answer(content: str) -> tuple[list[int], int]:
                body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
                        "max_tokens": int(0.7 * cap) - 40, "ignore_eos": True, "leyline": {}}  # fmt: skip
                r = await c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                out = r.json()
                await c.delete(f"/v1/leyline/sessions/{out['leyline']['session_id']}")
                return out["leyline"]["completion_token_ids"], out["usage"]["prompt_tokens"]

            together = await asyncio.gather(*(answer(p) for p in prompts))  # 2 x 0.7 of the pool: short
            metrics = (await c.get("/metrics")).text
            assert _metric(metrics, "leyline_retractions") >= 1
            assert all(40 >= prompt for _, prompt in together)  # (the max_tokens above leave them room)
            alone = [await answer(p) for p in prompts]
            assert [t for t, _ in together] == [t for t, _ in alone]
            assert _metric((await c.get("/metrics")).text, "leyline_kv_reserved_tokens") == 0
