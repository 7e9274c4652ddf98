"""No 5xx from any input: every route fuzzed from the server's own OpenAPI schema, plus random bodies.

* :func:`test_every_route_fuzzed_from_its_openapi_schema_never_5xx`: schemathesis generates
  requests for every operation in ``/openapi.json`` — valid ones and invalid ones (wrong types,
  missing fields, out-of-range values) — against a real server on a loopback port, with and
  without the API key, path ids both random and real. ``LEYLINE_FUZZ_EXAMPLES`` (default 1,500)
  bounds the run (about a minute on two cores).
* :func:`test_responses_and_messages_bodies_fuzzed_from_their_own_apis_never_5xx`: the same for
  ``/v1/responses`` and ``/v1/messages``, their bodies typed as OpenAI's and Anthropic's APIs
  define them (:mod:`tests.e2e.protocol_schemas`: input items, content blocks, tools, context
  edits) instead of the server's ``Any``; ``LEYLINE_PROTOCOL_FUZZ_EXAMPLES`` (default 1,000).
* The hypothesis tests below send structurally random JSON in-process, infinities included.

What a schema cannot express (lone surrogates, non-ASCII headers, chunked bodies, huge directive
results) is in ``tests/attack``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from leyline_sdk.core.responses_items import seal
from leyline_server.api.app import create_app
from tests.e2e.protocol_schemas import detailed
from tests.e2e.server_helpers import make_service, running_server

FUZZ_EXAMPLES = int(os.environ.get("LEYLINE_FUZZ_EXAMPLES", "1500"))
CHAT_EXAMPLES = 100  # valid chat completions after the whole-API fuzz: ~20 % are served, P(none) < 1e-9
PROTOCOL_EXAMPLES = int(os.environ.get("LEYLINE_PROTOCOL_FUZZ_EXAMPLES", "1000"))
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


SERVER_ERRORS = ('"server_error"', '"internal_error"', '"api_error"')  # a stream's error event of a 5xx kind


def _cases(schema: Any) -> Any:
    """The cases of ``schema`` (an API, or one operation): valid ones and invalid ones."""
    return schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)


def _fuzz(url: str, strategy: Any, examples: int, real_ids: Callable[[Any], None]) -> Counter:
    """Run ``strategy``'s cases against ``url``: no 5xx, errors in their protocol's shape, no stream
    that fails with a server error. ``real_ids(case)`` swaps real ids in."""
    statuses: Counter = Counter()
    http = requests.Session()
    auth = {"Authorization": f"Bearer {KEY}"}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, use_real_ids=st.booleans(), with_key=st.integers(0, 9), served_model=st.booleans())
    def fuzz(case, use_real_ids, with_key, served_model):
        if use_real_ids:
            real_ids(case)
        if served_model and isinstance(case.body, dict) and "model" in case.body:
            case.body = {**case.body, "model": "tiny-mla"}  # past the 404, into the rest of the request
        response = case.call(base_url=url, session=http, headers=auth if with_key else {}, timeout=120)
        statuses[(case.method.upper(), case.path, response.status_code)] += 1
        where = (case.method, case.formatted_path, response.status_code, response.text[:300], repr(case.body)[:300])
        assert response.status_code < 500, where
        if response.status_code >= 400 and case.path != "/metrics":
            _error_shape(response, case.path)
        if "text/event-stream" in str(response.headers.get("content-type")):
            assert not any(marker in response.text for marker in SERVER_ERRORS), where

    fuzz()
    assert httpx.get(url + "/health").status_code == 200
    return statuses


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

        def real_ids(case: Any) -> None:
            if case.path_parameters:
                case.path_parameters = {k: real.get(k, v) for k, v in case.path_parameters.items()}

        statuses = _fuzz(url, _cases(schema), FUZZ_EXAMPLES, real_ids)
        # Spread over every route, chat completions gets ~75 cases, of which ~1 % pass validation
        # (a served model, a key, no field we refuse): valid ones alone, so some surely reach decoding.
        chat = schema["/v1/chat/completions"]["POST"].as_strategy(GenerationMode.POSITIVE)
        statuses += _fuzz(url, chat, CHAT_EXAMPLES, real_ids)
    served = {(m, p) for m, p, status in statuses if status < 400}
    assert len(served) >= 9 and ("POST", "/v1/chat/completions") in served, statuses  # past validation


BODY_ROUTES = {("POST", "/v1/responses"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")}


def _stored(url: str) -> tuple[str, list[str]]:
    """A stored response of ``KEY`` with a message and a sealed reasoning item: its id and its items' ids."""
    items = [
        {"type": "message", "role": "user", "content": "remember", "id": "msg_fuzz"},
        {"type": "reasoning", "id": "rs_fuzz", "summary": [], "encrypted_content": seal("thinking " * 50)},
    ]
    body = {"model": "tiny-mla", "input": items, "include": ["reasoning.encrypted_content"]}
    answer = httpx.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}).json()
    return answer["id"], ["msg_fuzz", "rs_fuzz", *(item["id"] for item in answer["output"])]


def test_responses_and_messages_bodies_fuzzed_from_their_own_apis_never_5xx():
    """The request bodies of ``/v1/responses`` and ``/v1/messages`` (and ``count_tokens``) as OpenAI
    and Anthropic define them (:mod:`tests.e2e.protocol_schemas`), valid and invalid, stored ids and
    item references real or not, on a server that recognises conversations and splices."""
    service = make_service(default_max_tokens=2, api_keys=frozenset({KEY}), render_timeout_s=5.0, auto_splice=True)
    with running_server(service) as url:
        response_id, item_ids = _stored(url)
        openapi = detailed(httpx.get(url + "/openapi.json").json(), "tiny-mla")
        schema = schemathesis.openapi.from_dict(openapi).include(path_regex="^/v1/(responses|messages)", method="POST")
        operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
        assert operations == BODY_ROUTES

        def real_ids(case: Any) -> None:
            body = case.body if isinstance(case.body, dict) else {}
            if "previous_response_id" in body:
                body["previous_response_id"] = response_id
            for n, item in enumerate(body.get("input") if isinstance(body.get("input"), list) else []):
                if isinstance(item, dict) and item.get("type") == "item_reference":
                    item["id"] = item_ids[n % len(item_ids)]

        statuses: Counter = Counter()
        for operation in schema.get_all_operations():  # each its share of the examples
            statuses += _fuzz(url, _cases(operation.ok()), PROTOCOL_EXAMPLES // len(operations), real_ids)
    served = {(m, p) for m, p, status in statuses if status < 400}
    assert served == BODY_ROUTES, statuses  # each past validation too


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        # found by the fuzzer: a penalty that is 0 in float32 divided the seen logits by zero (inf,
        # nan) and sampling raised; now a 400 naming the field
        (
            "/v1/chat/completions",
            {"model": "tiny-mla", "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 5e-324},
            "repetition_penalty",
        ),
        # found by the fuzzer: an allowed tool's name that is a list was looked up in a dict (500)
        (
            "/v1/responses",
            {
                "model": "tiny-mla",
                "input": "hi",
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "tool_choice": {
                    "type": "allowed_tools",
                    "mode": "auto",
                    "tools": [{"type": "function", "name": ["f"]}],
                },
            },
            "tool_choice",
        ),
    ],
    ids=["tiny-repetition-penalty", "allowed-tool-named-by-a-list"],
)
def test_the_fuzzers_finds_are_400s_naming_the_field(app, path, body, param):
    r = post(app, path, body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert param in (r.json()["error"]["param"] or ""), r.text
