"""HTTP API beyond the OpenAI surface: sessions, directives, auth, limits, errors, metrics."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest

from leyline_sdk.core.directives import Directive, apply, digest
from tests.e2e.server_helpers import make_service, running_server

KEY_A, KEY_B = "sk-alpha", "sk-beta"


@pytest.fixture(scope="module")
def server():
    service = make_service(
        api_keys=frozenset({KEY_A, KEY_B}),
        max_directives=4,
        max_replacement_tokens=50,
        max_sessions_per_key=40,
        max_body_bytes=200_000,
    )
    with running_server(service) as url:
        yield url


def http(server, key=KEY_A):
    return httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def error_of(response, status, code):
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["type"] and body["message"]
    return body


async def test_sixteen_concurrent_sessions_edit_independently(server):
    rng = random.Random(0)

    async def one(i):
        async with http(server) as c:
            tokens = [rng.randint(7, 1000) for _ in range(rng.randint(20, 60))]
            r = await c.post("/v1/leyline/sessions", json={"tokens": tokens})
            sid = r.json()["id"]
            expected = tokens
            for _ in range(6):
                n = len(expected)
                a = rng.randint(0, n)
                b = rng.randint(a, min(n, a + 10))
                d = Directive(
                    start=a,
                    end=b,
                    replacement=[rng.randint(7, 1000) for _ in range(rng.randint(0, 5))],
                    mode=rng.choice(["amortize", "amortize", "forget"]),
                )
                r = await c.post(
                    f"/v1/leyline/sessions/{sid}/directives",
                    json={
                        "base": {"length": n, "digest": digest(expected)},
                        "directives": [d.model_dump(mode="json")],
                        "strict": True,
                    },
                )
                assert r.status_code == 200, r.text
                expected = apply(expected, [d])
                assert r.json()["applied"] and r.json()["base"] == {"length": len(expected), "digest": digest(expected)}
            return sid, expected

    results = await asyncio.gather(*(one(i) for i in range(16)))
    async with http(server) as c:
        for sid, expected in results:
            assert (await c.get(f"/v1/leyline/sessions/{sid}")).json()["tokens"] == expected


async def test_auth_and_session_privacy(server):
    async with httpx.AsyncClient(base_url=server) as anonymous:
        error_of(await anonymous.get("/v1/models"), 401, "invalid_api_key")
        assert (await anonymous.get("/health")).status_code == 200
    async with http(server, "sk-wrong") as wrong:
        error_of(
            await wrong.post("/v1/leyline/tokenize", json={"messages": [{"role": "user", "content": "x"}]}),
            401,
            "invalid_api_key",
        )
    async with http(server, KEY_A) as a, http(server, KEY_B) as b:
        sid = (await a.post("/v1/leyline/sessions", json={"tokens": [10, 11, 12]})).json()["id"]
        error_of(await b.get(f"/v1/leyline/sessions/{sid}"), 404, "session_not_found")
        error_of(await b.delete(f"/v1/leyline/sessions/{sid}"), 404, "session_not_found")
        error_of(
            await b.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": [{"start": 0, "end": 1}]}),
            404,
            "session_not_found",
        )
        assert (await a.get(f"/v1/leyline/sessions/{sid}")).status_code == 200
        assert (await a.delete(f"/v1/leyline/sessions/{sid}")).json()["deleted"] is True
        error_of(await a.get(f"/v1/leyline/sessions/{sid}"), 404, "session_not_found")
    client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()
    models = await openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY_A).models.list()
    assert [m.id for m in models.data] == ["tiny-mla"]


async def test_error_paths(server):
    async with http(server) as c:
        sid = (await c.post("/v1/leyline/sessions", json={"tokens": list(range(10, 40))})).json()["id"]
        directives_url = f"/v1/leyline/sessions/{sid}/directives"
        # malformed bodies -> 400 in OpenAI's shape, naming the field
        body = error_of(
            await c.post(directives_url, json={"directives": [{"start": 5, "end": 2}]}), 400, "invalid_request"
        )
        assert "end" in body["param"]
        error_of(
            await c.post("/v1/chat/completions", json={"model": "tiny-mla", "messages": []}), 400, "invalid_request"
        )
        body = error_of(
            await c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}),
            400,
            "invalid_request",
        )
        assert body["param"] is None and "JSON" in body["message"]  # not a character offset
        one = {"model": "tiny-mla", "messages": [{"role": "user", "content": "x"}]}
        error_of(await c.post("/v1/chat/completions", json={**one, "model": "gpt-4o"}), 404, "model_not_found")
        for field, value in [
            ("n", 2),
            ("functions", [{"name": "f"}]),
            ("store", True),
            ("modalities", ["text", "audio"]),
            ("verbosity", "low"),
            ("return_hidden_states", True),
            ("prompt_cache_retention", "24h"),
        ]:
            body = error_of(
                await c.post("/v1/chat/completions", json={**one, field: value}), 400, "unsupported_parameter"
            )
            assert body["param"] == field
        body = error_of(await c.post("/v1/chat/completions", json={**one, "frobnicate": 1}), 400, "invalid_request")
        assert body["param"] == "frobnicate" and "unrecognized" in body["message"]
        body = error_of(await c.post("/v1/chat/completions", json={**one, "top_logprobs": 2}), 400, "invalid_request")
        assert body["param"] == "top_logprobs"
        body = error_of(
            await c.post("/v1/chat/completions", json={**one, "tool_choice": "required"}), 400, "invalid_request"
        )
        assert body["param"] == "tool_choice"  # nothing to call
        error_of(await c.post("/v1/leyline/sessions", json={}), 400, "invalid_request")
        error_of(await c.post("/v1/leyline/sessions", json={"tokens": []}), 400, "empty_session")
        error_of(await c.post("/v1/leyline/sessions", json={"tokens": [10**6]}), 400, "token_invalid")
        # limits
        error_of(
            await c.post(directives_url, json={"directives": [{"start": i, "end": i} for i in range(5)]}),
            400,
            "too_many_directives",
        )
        error_of(
            await c.post(directives_url, json={"directives": [{"start": 0, "end": 0, "replacement": [9] * 51}]}),
            400,
            "replacement_too_long",
        )
        error_of(
            await c.post(directives_url, content=b"x" * 200_001, headers={"content-type": "application/json"}),
            413,
            "body_too_large",
        )
        error_of(
            await c.post(
                "/v1/chat/completions",
                json={"model": "tiny-mla", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
            ),
            400,
            "context_length_exceeded",
        )
        # strict directive failures
        error_of(
            await c.post(
                directives_url, json={"base": {"length": 3}, "strict": True, "directives": [{"start": 0, "end": 1}]}
            ),
            409,
            "base_mismatch",
        )
        error_of(
            await c.post(directives_url, json={"strict": True, "directives": [{"start": 0, "end": 99}]}),
            422,
            "span_invalid",
        )
        error_of(
            await c.post(
                directives_url, json={"strict": True, "directives": [{"start": 0, "end": 1, "replacement": [5000]}]}
            ),
            422,
            "token_invalid",
        )
        # non-strict: reported, nothing changed
        r = (await c.post(directives_url, json={"directives": [{"start": 0, "end": 99}]})).json()
        assert r["applied"] is False and r["fallback"]["code"] == "span_invalid" and r["base"]["length"] == 30
        error_of(await c.get("/v1/leyline/sessions/does-not-exist"), 404, "session_not_found")
        error_of(await c.get("/v1/nowhere"), 404, "http_error")


async def test_sessions_over_the_key_cap_drop_the_oldest_instead_of_refusing(server):
    async with http(server, KEY_B) as c:
        made = []
        for _ in range(45):  # the cap is 40
            r = await c.post("/v1/leyline/sessions", json={"tokens": [10, 11]})
            assert r.status_code == 200, r.text
            made.append(r.json()["id"])
        live = [sid for sid in made if (await c.get(f"/v1/leyline/sessions/{sid}")).status_code == 200]
        assert live == made[5:]  # the five least recently used went
        for sid in live:
            await c.delete(f"/v1/leyline/sessions/{sid}")


async def test_metrics_count_splices_and_requests(server):
    async with http(server) as c:
        sid = (await c.post("/v1/leyline/sessions", json={"tokens": list(range(10, 60))})).json()["id"]
        await c.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": [{"start": 5, "end": 9}]})
        await c.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": [{"start": 0, "end": 999}]})
        text = (await c.get("/metrics")).text
    assert 'leyline_splices_total{code="",outcome="applied"}' in text
    assert 'leyline_splices_total{code="span_invalid",outcome="fallback"}' in text
    assert 'leyline_tokens_total{kind="rotated"}' in text
    assert 'leyline_requests_total{route="/v1/leyline/sessions/{session_id}/directives",status="200"}' in text
    assert "leyline_request_seconds_bucket" in text


async def test_auto_splice_continues_a_plain_clients_own_conversation_only():
    service = make_service(auto_splice=True)
    messages = [
        {"role": "user", "content": "read"},
        {"role": "tool", "tool_call_id": "c", "content": "line of output\n" * 30},
        {"role": "user", "content": "next"},
    ]
    with running_server(service) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        first = await client.chat.completions.create(model="tiny-mla", messages=messages, max_tokens=2)
        reply = {"role": "assistant", "content": first.choices[0].message.content or ""}
        more = [*messages, reply, {"role": "user", "content": "and then"}]
        second = await client.chat.completions.create(model="tiny-mla", messages=more, max_tokens=2)
        edited = [messages[0], {**messages[1], "content": "[evicted]"}, messages[2], {"role": "user", "content": "x"}]
        third = await client.chat.completions.create(model="tiny-mla", messages=edited, max_tokens=2)
    assert second.leyline["session_id"] == first.leyline["session_id"]  # its own previous turn, extended
    assert second.leyline["approximate_tokens"] == 0 or second.leyline["auto_splice"]
    # an edit of an earlier message cannot be told from another conversation: a new session, exact
    ext = third.leyline
    assert ext["session_id"] not in (first.leyline["session_id"], None)
    assert not ext["auto_splice"] and ext["approximate_tokens"] == 0 and ext["rotated_tokens"] == 0
    assert third.usage.prompt_tokens_details.cached_tokens == ext["reused_tokens"] > 0  # the exact prefix


async def test_a_pool_full_of_idle_sessions_makes_room_instead_of_failing():
    service = make_service(kv_budget_mb=0.2, max_context_tokens=4096)  # a few hundred token slots
    capacity = service.engine.info.kv_capacity_tokens
    with running_server(service) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            sessions = []
            for i in range(capacity // 40):  # pin most of the pool with idle sessions
                r = await c.post("/v1/leyline/sessions", json={"tokens": [10 + i] + list(range(100, 138))})
                assert r.status_code == 200, r.text
                sessions.append(r.json()["id"])
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            words = 1
            while len(service.chat.render([{"role": "user", "content": "word " * words}]).tokens) < capacity // 2:
                words += 1
            big = [{"role": "user", "content": "word " * words}]
            ok = await client.chat.completions.create(model="tiny-mla", messages=big, max_tokens=2)
            assert ok.choices  # served: the oldest idle sessions were dropped to make room
            assert (await c.get(f"/v1/leyline/sessions/{sessions[0]}")).status_code == 404
            assert (await c.get(f"/v1/leyline/sessions/{sessions[-1]}")).status_code == 200
            too_long = [{"role": "user", "content": "word " * capacity}]
            with pytest.raises(openai.BadRequestError) as info:  # longer than the pool: the context limit
                await client.chat.completions.create(model="tiny-mla", messages=too_long, max_tokens=2)
            assert info.value.body["code"] == "context_length_exceeded"
