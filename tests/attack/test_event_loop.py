"""Round two: one key's schema work must not hurt the server or another key.

Findings, each a test (both CPU engines):

* a 1.7 MB schema (20,000 ``$defs``: 13 s of validation on the event loop) and an object of 1,000
  optional properties (5.6 s to compile) are refused at once, 400 ``schema_too_complex`` naming
  the schema (before: 200 after 10-24 s of frozen ``/health``);
* 4,000 tools with ``tool_choice: required`` are refused by the length check before any schema
  work (before: the constraint was built and compiled first, the 400 came after 10.6 s);
* while key A compiles three near-limit schemas (15 objects of 128 optional properties, ~1 s each
  alone), ``/health`` and key B's short chat answer within 1 s, and B's own new schema compiles
  within 1 s (before: 33 s behind A's compiles): A has one compile thread, B another;
* a compile past ``--compile-timeout`` answers 400 ``constraint_timeout`` naming the field, and its
  grammar, compiled in the background, serves the same request afterwards (the cache works);
* a stream's opening does not wait for its grammar (Claude Code's 24 tools took ~9 s to compile
  before its first byte): the compile runs beside the prefill, and the answer still follows the
  schema; past the budget, a stream ends in an error event naming the field.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema

from tests.attack.helpers import KEYS, MODEL, auth, serve, service


def huge_schema(defs: int = 20_000) -> dict:
    shapes = {f"d{i}": {"type": "object", "properties": {"a": {"type": "integer"}}} for i in range(defs)}
    return {"$defs": shapes, "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}}


def optional_props(n: int, tag: str = "") -> dict:
    return {"type": "object", "properties": {f"{tag}p{i}": {"type": "integer"} for i in range(n)}}


def near_limit(tag: str, objects: int = 15, props: int = 128) -> dict:
    """A schema inside the budget that still takes ~1 s to compile (distinct per ``tag``: no cache hit)."""
    names = [f"{tag}o{i}" for i in range(objects)]
    return {"type": "object", "properties": {n: optional_props(props, tag) for n in names}, "required": names}


def chat(schema: dict | None = None, content: str = "x") -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return body


async def test_schemas_past_the_budget_are_refused_at_once_naming_the_schema(engine):
    with serve(service(engine, max_body_bytes=16 * 2**20)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            for schema in (huge_schema(), optional_props(1000)):
                started = time.perf_counter()
                r = await c.post("/v1/chat/completions", json=chat(schema))
                took = time.perf_counter() - started
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["code"] == "schema_too_complex" and error["param"] == "response_format.json_schema.schema"
                assert took < 3.0, f"refused after {took:.1f} s: the schema was worked on first"
            r = await c.post("/v1/chat/completions", json=chat(optional_props(100)))  # inside the budget
            assert r.status_code == 200, r.text


async def test_too_many_tools_are_refused_by_the_length_check_first(engine):
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": optional_props(3, f"t{i}")}}
        for i in range(4000)
    ]
    body = {**chat(), "tools": tools, "tool_choice": "required"}
    with serve(service(engine, max_body_bytes=16 * 2**20)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            started = time.perf_counter()
            r = await c.post("/v1/chat/completions", json=body)
            took = time.perf_counter() - started
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert took < 6.0, f"refused after {took:.1f} s"  # 10.6 s when the constraint came first


async def _timed(coro) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await coro
    return response, time.perf_counter() - started


async def test_one_keys_compiles_do_not_hold_back_health_or_another_key(engine):
    svc = service(engine, api_keys=frozenset(KEYS))
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            a, b = auth("key-a"), auth("key-b")
            warm = await c.post("/v1/chat/completions", json=chat(optional_props(2, "w")), headers=b)
            assert warm.status_code == 200, warm.text
            heavy = [
                asyncio.create_task(c.post("/v1/chat/completions", json=chat(near_limit(f"a{i}")), headers=a))
                for i in range(3)
            ]
            for _ in range(100):  # A's schemas are checked, then its first compile runs (the others wait)
                if svc.compiles.running("key-a"):
                    break
                await asyncio.sleep(0.05)
            assert svc.compiles.running("key-a")
            health, health_s = await _timed(c.get("/health"))
            short, short_s = await _timed(c.post("/v1/chat/completions", json=chat(content="hi"), headers=b))
            own, own_s = await _timed(c.post("/v1/chat/completions", json=chat(optional_props(20, "b")), headers=b))
            assert not all(t.done() for t in heavy), "A's compiles were over before anything was measured"
            answers = await asyncio.gather(*heavy)
    assert health.status_code == 200 and short.status_code == 200 and own.status_code == 200, own.text
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert health_s < 1.0 and short_s < 1.0 and own_s < 1.0, (health_s, short_s, own_s)


async def test_a_compile_past_its_budget_is_a_400_and_its_grammar_is_kept(engine):
    svc = service(engine, compile_timeout_s=0.05)
    body = chat(near_limit("slow"))
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "constraint_timeout" and error["param"] == "response_format.json_schema.schema"
            for _ in range(200):  # the compile finishes in the background
                if not svc.compiles.running(None):
                    break
                await asyncio.sleep(0.1)
            again = await c.post("/v1/chat/completions", json=body)
    assert again.status_code == 200, again.text


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def test_a_streams_opening_does_not_wait_for_its_compile(engine):
    svc = service(engine)
    schema = near_limit("open", objects=4, props=64)
    body = {**chat(schema), "stream": True, "max_tokens": 64, "temperature": 0}
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.aiter_lines()
                first = await anext(lines)
                compiling = svc.compiles.running(None)  # the first byte came while the grammar compiled
                rest = [line async for line in lines]
    assert r.status_code == 200 and first.startswith("data: "), first
    assert compiling, "the stream opened only after its compile"
    events = _events([first, *rest])
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    if events[-1]["choices"][0]["finish_reason"] == "stop":  # whole: it must match the schema
        jsonschema.validate(json.loads(text), schema)
    else:  # cut by max_tokens: still a prefix the schema's grammar allowed (its first property, in order)
        assert text.startswith('{"openo0": {'), text


async def test_a_stream_past_its_compile_budget_ends_in_an_error_naming_the_field(engine):
    svc = service(engine, compile_timeout_s=0.05)
    body = {**chat(near_limit("late")), "stream": True}
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = [line async for line in r.aiter_lines()]
    assert r.status_code == 200  # the stream had opened
    errors = [e["error"] for e in _events(lines) if "error" in e]
    assert errors and errors[0]["code"] == "constraint_timeout", lines
    assert errors[0]["param"] == "response_format.json_schema.schema"
