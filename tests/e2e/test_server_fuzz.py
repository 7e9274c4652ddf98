"""No 5xx from any input: every route fuzzed from the server's own OpenAPI schema, plus random bodies.

* :func:`test_every_route_fuzzed_from_its_openapi_schema_never_5xx`: schemathesis generates
  requests for every operation in ``/openapi.json`` — valid ones and invalid ones (wrong types,
  missing fields, out-of-range values) — against a real server on a loopback port, with and
  without the API key, path ids both random and real. ``LEYLINE_FUZZ_EXAMPLES`` (default 1,500)
  bounds the run (about a minute on two cores).
* The hypothesis tests below send structurally random JSON in-process, infinities included.

What a schema cannot express (lone surrogates, non-ASCII headers, chunked bodies, huge directive
results) is in ``tests/attack``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from leyline_server.api.app import create_app
from tests.e2e.server_helpers import make_service, running_server

FUZZ_EXAMPLES = int(os.environ.get("LEYLINE_FUZZ_EXAMPLES", "1500"))
KEY = "fuzz-key"

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


def _error_shape(response: requests.Response, path: str) -> None:
    """OpenAI's error shape; Anthropic's on the Messages API's routes."""
    body = response.json()
    error = body["error"]
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(error) == {"type", "code", "message"} and error["message"], body
        return
    assert set(error) == {"type", "code", "message", "param"} and error["message"], error


def test_every_route_fuzzed_from_its_openapi_schema_never_5xx():
    service = make_service(default_max_tokens=2, api_keys=frozenset({KEY}), render_timeout_s=5.0)
    with running_server(service) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        real = {
            "session_id": httpx.post(
                url + "/v1/leyline/sessions", json={"tokens": list(range(5, 40))}, headers=auth
            ).json()["id"],
            "block_id": httpx.post(
                url + "/v1/leyline/blocks", json={"tokens": list(range(5, 20))}, headers=auth
            ).json()["id"],
        }
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
        assert len(operations) >= 11, operations  # every route is in the schema
        strategy = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)
        statuses: Counter = Counter()
        http = requests.Session()

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy, use_real_ids=st.booleans(), with_key=st.integers(0, 9), served_model=st.booleans())
        def fuzz(case, use_real_ids, with_key, served_model):
            if use_real_ids and case.path_parameters:
                case.path_parameters = {k: real.get(k, v) for k, v in case.path_parameters.items()}
            if served_model and isinstance(case.body, dict) and "model" in case.body:
                case.body = {**case.body, "model": "tiny-mla"}  # past the 404, into the rest of the request
            response = case.call(base_url=url, session=http, headers=auth if with_key else {}, timeout=120)
            statuses[(case.method.upper(), case.path, response.status_code)] += 1
            where = (case.method, case.formatted_path, response.status_code, response.text[:300], repr(case.body)[:300])
            assert response.status_code < 500, where
            if response.status_code >= 400 and case.path != "/metrics":
                _error_shape(response, case.path)

        fuzz()
        assert httpx.get(url + "/health").status_code == 200
    served = {(m, p) for m, p, status in statuses if status < 400}
    assert len(served) >= 9 and ("POST", "/v1/chat/completions") in served, statuses  # past validation
