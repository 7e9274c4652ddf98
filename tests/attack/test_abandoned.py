"""A whole answer whose client has gone stops decoding and gives its reservation back.

The scheduler issue's finding: a non-streamed request without ``max_tokens`` kept decoding for
12 minutes after its connection closed, holding a reservation of the whole pool. Here the client
gives up half a second into a request that would decode ~4,000 tokens (the end token
forbidden by ``logit_bias``); the server's ``/metrics`` must show no KV reserved within a few
seconds, and another key's request must be served at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from tests.attack.helpers import KEYS, MODEL, ServerProcess, auth, serve, service


def _reserved(metrics: str) -> float:
    """``leyline_kv_reserved_tokens`` from a ``/metrics`` page."""
    line = next(x for x in metrics.splitlines() if x.startswith("leyline_kv_reserved_tokens "))
    return float(line.split()[1])


async def test_a_whole_answer_stops_when_its_client_has_gone(engine):
    svc = service(engine, default_max_tokens=None, api_keys=frozenset(KEYS))  # no limit: it would fill the context
    bias = {str(t): -100 for t in svc.engine.info.eos_token_ids}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "talk"}], "logit_bias": bias}
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=auth(KEYS[0])) as impatient:
            asked = asyncio.create_task(impatient.post("/v1/chat/completions", json=body))
            while svc.admission.in_flight(KEYS[0])[0] == 0:  # admitted: it decodes
                assert not asked.done(), asked.result().text
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            assert not asked.done(), "the answer was done already: nothing was measured"
            asked.cancel()  # the client gives up: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await asked
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            deadline = time.monotonic() + 5
            while _reserved((await c.get("/metrics")).text) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _reserved((await c.get("/metrics")).text) == 0  # cancelled, its reservation released
            assert svc.admission.in_flight(KEYS[0]) == (0, 0)
            started = time.perf_counter()
            short = {**body, "max_tokens": 4}
            answer = await c.post("/v1/chat/completions", json=short, headers=auth(KEYS[1]))  # another key
            assert answer.status_code == 200, answer.text
            assert time.perf_counter() - started < 5.0  # at once: nothing of the gone request in the way


async def test_shutdown_does_not_wait_on_an_answer_whose_client_has_gone(engine):
    """SIGTERM right after the client gave up: the server exits at once, not after the answer.

    The scheduler issue's finding: SIGTERM waited on the abandoned answer (killed after 18 s). The
    graceful timeout here is 30 s, so only the cancellation makes the exit prompt.
    """
    with ServerProcess(engine, None, "--graceful-timeout", "30") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "talk"}], "max_tokens": 4000,
                    "ignore_eos": True}  # fmt: skip
            asked = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            deadline = time.monotonic() + 30
            while not _reserved((await c.get("/metrics")).text):  # not admitted yet
                assert not asked.done() and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)
            assert not asked.done(), "the answer was done already: nothing was measured"
            asked.cancel()  # the client gives up
            with contextlib.suppress(asyncio.CancelledError):
                await asked
        assert server.proc is not None
        started = time.perf_counter()
        server.proc.terminate()
        code = server.proc.wait(timeout=60)
        took = time.perf_counter() - started
    assert code == 0 and took < 5.0, (code, took)
