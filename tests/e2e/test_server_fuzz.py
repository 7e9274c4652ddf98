"""Fuzzed request bodies never produce a 500 (hypothesis, in-process ASGI), infinities included."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leyline_server.api.app import create_app
from tests.e2e.server_helpers import make_service

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool", "bogus"]),
        "content": st.none() | st.text(max_size=30),
    }
)
directive = st.fixed_dictionaries(
    {
        "start": st.integers(-3, 60),
        "end": st.integers(-3, 60),
        "replacement": st.lists(st.integers(-2, 2000), max_size=5),
        "mode": st.sampled_from(["amortize", "forget", "x"]),
    }
)
chat_body = st.fixed_dictionaries(
    {"model": st.text(max_size=5), "messages": st.lists(message, max_size=3)},
    optional={
        "max_tokens": st.integers(-2, 4),
        "temperature": st.floats(-1, 3, allow_nan=False) | st.sampled_from([float("inf"), float("-inf")]),
        "top_p": st.floats(-1, 2, allow_nan=False),
        "stop": st.none() | st.text(max_size=3),
        "seed": st.integers(-5, 5),
        "leyline": st.fixed_dictionaries(
            {},
            optional={
                "session_id": st.none() | st.text(max_size=5),
                "strict": st.booleans(),
                "directives": st.lists(directive, max_size=3),
                "base": st.fixed_dictionaries(
                    {"length": st.integers(-1, 60)}, optional={"digest": st.text(max_size=8)}
                ),
            },
        ),
    },
)
ROUTES = [
    "/v1/chat/completions",
    "/v1/leyline/tokenize",
    "/v1/leyline/sessions",
    "/v1/leyline/sessions/{sid}/directives",
]


@pytest.fixture(scope="module")
def app():
    service = make_service(default_max_tokens=2)
    yield create_app(service)
    asyncio.run(service.shutdown())


def post(app, path, body):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            sid = (await c.post("/v1/leyline/sessions", json={"tokens": list(range(10, 50))})).json()["id"]
            # encoded here, not by httpx: non-finite floats go out as JSON's Infinity/NaN extensions,
            # which Python's (and so the server's) JSON parser accepts
            content = json.dumps(body, allow_nan=True)
            return await c.post(path.format(sid=sid), content=content, headers={"content-type": "application/json"})

    return asyncio.run(go())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(ROUTES), body=json_values | chat_body)
def test_random_bodies_never_500(app, path, body):
    r = post(app, path, body)
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"type", "code", "message", "param"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=chat_body)
def test_random_chat_requests_never_500(app, body):
    r = post(app, "/v1/chat/completions", body)
    assert r.status_code < 500, (r.status_code, r.text)
