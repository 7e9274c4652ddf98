"""A whole answer whose client has gone stops decoding and gives its reservation back.

The scheduler issue's finding: a non-streamed request without ``max_tokens`` kept decoding for
12 minutes after its connection closed, holding a reservation of the whole pool. Here the client
gives up after half a second on a request that would decode ~4,000 tokens (the end token
forbidden by ``logit_bias``); the server's own admission counter must show nothing in flight
within a few seconds, and the next request must be served.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.attack.helpers import MODEL, serve, service


async def test_a_whole_answer_stops_when_its_client_has_gone(engine):
    svc = service(engine, default_max_tokens=None)  # no limit: the answer would fill the context
    bias = {str(t): -100 for t in svc.engine.info.eos_token_ids}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "talk"}], "logit_bias": bias}
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post("/v1/chat/completions", json=body)
        assert svc.admission.in_flight(None)[0] == 1, "the answer was done already: nothing was measured"
        deadline = time.monotonic() + 5
        while svc.admission.in_flight(None) != (0, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert svc.admission.in_flight(None) == (0, 0)  # cancelled, its reservation released
        async with httpx.AsyncClient(base_url=url, timeout=30) as patient:
            short = {**body, "max_tokens": 4}
            assert (await patient.post("/v1/chat/completions", json=short)).status_code == 200
