"""A whole answer whose client has gone stops decoding and gives its reservation back.

The scheduler issue's finding: a non-streamed request without ``max_tokens`` kept decoding for
12 minutes after its connection closed, holding a reservation of the whole pool. Here the client
gives up half a second into a request that would decode ~4,000 tokens (the end token
forbidden by ``logit_bias``); the server's ``/metrics`` must show no KV reserved within a few
seconds, and another key's request must be served at once.

And a stream its client closes unread: the next request on its session finds the session where
the stream left it, however the cancellation is timed (issue 43's race).
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


async def test_the_turn_after_an_abandoned_stream_finds_the_session_where_the_stream_left_it(engine):
    """The openai-idioms race (issue 43), made deterministic.

    A stream closed unread while the server's write waits on the client: the route's generator is
    closed, but the decode loop inside it was only dropped, and the engine committed its tokens
    later, after the session had been handed to the next request. Here the engine thread is held
    while the client closes the stream and reads the session at once (what the SDK does before its
    next turn): the base it reads must be the one the stream leaves, and the next turn, sent with
    that base, must continue the session without a ``base_mismatch``.
    """
    import socket
    import threading

    svc = service(engine, stream_stall_timeout_s=60)
    messages = [{"role": "user", "content": "count"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 3000, "ignore_eos": True, "temperature": 0,
            "stream": True, "leyline": {}}  # fmt: skip
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    gate = threading.Event()
    with serve(svc, send_buffer=8192) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            async with httpx.AsyncClient(base_url=url, timeout=120, transport=transport) as reader:
                request = reader.build_request("POST", "/v1/chat/completions", json=body)
                stream = await reader.send(request, stream=True)
                session_id = stream.headers["x-leyline-session"]
                await asyncio.sleep(1.0)  # the server's writes now wait on a client that reads nothing
                held = asyncio.ensure_future(svc.engine.scheduler.call(gate.wait))  # the engine thread is busy
                await stream.aclose()  # the client gives up on the stream
            read = asyncio.ensure_future(c.get(f"/v1/leyline/sessions/{session_id}"))  # at once
            await asyncio.sleep(0.5)
            gate.set()
            await held
            first = (await read).json()
            await asyncio.sleep(0.5)
            settled = (await c.get(f"/v1/leyline/sessions/{session_id}")).json()
            assert first["base"] == settled["base"], "the session was read before the stream's tokens were kept"
            assert settled["base"]["length"] > 20  # the prompt and the tokens the stream sent before it stalled
            ext = {"session_id": session_id, "base": first["base"]}
            more = messages + [{"role": "assistant", "content": "1 2 3"}, {"role": "user", "content": "go on"}]
            nxt = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": more, "max_tokens": 2,
                                                             "leyline": ext})  # fmt: skip
            assert nxt.status_code == 200, nxt.text
            assert nxt.json()["leyline"]["fallback"] is None
