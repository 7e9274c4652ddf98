"""Structured outputs and forced tool calls on the real server, through the real ``openai`` client.

The tiny presets are random models: left alone they write noise, so every valid JSON answer and
every well-formed call below is the constraint's doing. Oracles: ``jsonschema`` for answers and
arguments, a fresh prefill for what a turn after a splice must decode, the whole response for
what a stream of the same tokens must add up to.
"""

from __future__ import annotations

import importlib.util
import json

import httpx
import jsonschema
import openai
import pytest

from leyline_sdk.core.directives import Directive, apply
from tests.e2e.server_helpers import make_service, running_server

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "sure": {"type": "boolean"},
    },
    "required": ["answer", "score", "sure"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "celsius": {"type": "boolean"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}
FILE = {"type": "object", "properties": {"path": {"enum": ["a.py", "b.py"]}}, "required": ["path"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "read_file", "parameters": FILE}},
]
ARGS = {"get_weather": WEATHER, "read_file": FILE}
ASK = [{"role": "user", "content": "Is it sunny in Paris? Answer in JSON."}]
ENGINES = ["embedded"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") else [])
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module", params=ENGINES)
def server(request):
    """A one-layer tiny GQA model (a splice then equals a fresh prefill) on each engine."""
    with running_server(make_service("tiny-gqa", layers=1, engine=request.param)) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def tiny_vocab() -> list[str]:
    """The tiny tokenizer's tokens as text (both engines use it for the tiny presets)."""
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    return [tok.decode([i]) for i in range(len(tok))]


def check_calls(calls, names=None):
    assert calls
    for call in calls:
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), ARGS[call.function.name])


async def test_json_schema_answers_validate_streamed_or_not(client):
    for i, question in enumerate(["Paris?", "Rome?", "Is the sky green today, honestly?"]):
        messages = [{"role": "user", "content": question}]
        whole = await client.chat.completions.create(
            model="tiny-gqa", messages=messages, response_format=JSON_SCHEMA, temperature=0, max_tokens=64
        )
        assert whole.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(whole.choices[0].message.content), SCHEMA)
        sampled = await client.chat.completions.create(
            model="tiny-gqa", messages=messages, response_format=JSON_SCHEMA, temperature=1.0, seed=i, max_tokens=64
        )
        jsonschema.validate(json.loads(sampled.choices[0].message.content), SCHEMA)
    # a random model writes keys forever: push the braces up; the grammar still only lets "}" in
    # where JSON allows it (not first), so the answer is "{}"
    braces = {str(t): 50 for t, text in enumerate(tiny_vocab()) if text in ("{", "}")}
    stream = await client.chat.completions.create(
        model="tiny-gqa",
        messages=ASK,
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=64,
        stream=True,
        logit_bias=braces,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "{}"


async def test_forced_tool_calls(client):
    base = dict(model="tiny-gqa", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
    one = await client.chat.completions.create(**base, tool_choice="required", parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls" and one.choices[0].message.content is None
    assert len(one.choices[0].message.tool_calls) == 1
    check_calls(one.choices[0].message.tool_calls)
    for name in ("get_weather", "read_file"):
        named = await client.chat.completions.create(
            **base, tool_choice={"type": "function", "function": {"name": name}}
        )
        calls = named.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == [name]
        check_calls(calls)
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [TOOLS[1]]}}
    subset = await client.chat.completions.create(**{**base, "temperature": 1.0}, tool_choice=allowed, seed=3)
    check_calls(subset.choices[0].message.tool_calls, {"read_file"})
    either = await client.chat.completions.create(**base, response_format=JSON_SCHEMA)  # calls or the answer
    message = either.choices[0].message
    if message.tool_calls:
        check_calls(message.tool_calls)
    else:
        jsonschema.validate(json.loads(message.content), SCHEMA)


async def stream_of(client, **kw):
    """(content, [(name, arguments)], finish reason, token ids) of a stream."""
    content, calls, finish, ids = "", [], None, None
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        calls += [(c.function.name, c.function.arguments) for c in choice.delta.tool_calls or []]
        if choice.finish_reason:
            finish, ids = choice.finish_reason, chunk.leyline["completion_token_ids"]
    return content, calls, finish, ids


async def test_streamed_and_whole_answers_agree_for_the_same_tokens(client):
    cases = [dict(tools=TOOLS), dict(tools=TOOLS, tool_choice="required"), dict(stop=["e"]), {}]
    for extra in cases:
        for max_tokens in (1, 3, 7, 12, 40):
            kw = dict(model="tiny-gqa", messages=ASK, temperature=0, max_tokens=max_tokens, **extra)
            whole = await client.chat.completions.create(**kw)
            content, calls, finish, ids = await stream_of(client, **kw)
            message = whole.choices[0].message
            assert ids == whole.leyline["completion_token_ids"], (extra, max_tokens)
            assert content == (message.content or ""), (extra, max_tokens)
            assert calls == [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
            assert finish == whole.choices[0].finish_reason
            if "tools" not in extra:
                assert message.tool_calls is None


async def tokenize(http, messages, generation):
    r = await http.post("/v1/leyline/tokenize", json={"messages": messages, "add_generation_prompt": generation})
    r.raise_for_status()
    return r.json()


HISTORY = [
    {"role": "system", "content": "You are a weather agent."},
    {"role": "user", "content": "Check the logs."},
    {"role": "assistant", "content": "Reading them."},
    {"role": "user", "content": "log line: all good\n" * 30},
    {"role": "user", "content": "Is it sunny in Paris?"},
]


def edited(stub: str) -> list[dict[str, str]]:
    """HISTORY with its log message replaced by ``stub``."""
    return [*HISTORY[:3], {"role": "user", "content": stub}, HISTORY[4]]


async def spliced_session(server, stub: str) -> str:
    """A session on HISTORY whose log message was replaced by ``stub`` with an amortize splice."""
    async with httpx.AsyncClient(base_url=server) as http:
        old, new = await tokenize(http, HISTORY, False), await tokenize(http, edited(stub), False)
        span, new_span = old["message_spans"][3], new["message_spans"][3]
        replacement = new["tokens"][new_span["start"] : new_span["end"]]
        directive = Directive(start=span["start"], end=span["end"], replacement=replacement)
        assert apply(old["tokens"], [directive]) == new["tokens"]
        sid = (await http.post("/v1/leyline/sessions", json={"messages": HISTORY})).json()["id"]
        r = await http.post(f"/v1/leyline/sessions/{sid}/directives", json={"directives": [directive.model_dump()]})
        assert r.json()["applied"] and r.json()["rotated_tokens"] > 0
    return sid


async def test_a_turn_after_a_splice_is_constrained_like_a_fresh_one(client, server):
    for i, fmt in enumerate((JSON_SCHEMA, {"type": "json_object"})):
        stub = f"[evicted {i}]"  # a prompt no earlier request cached exactly
        sid = await spliced_session(server, stub)
        kw = dict(model="tiny-gqa", messages=edited(stub), response_format=fmt, temperature=0, max_tokens=48)
        spliced = await client.chat.completions.create(**kw, extra_body={"leyline": {"session_id": sid}})
        assert spliced.leyline["approximate_tokens"] > 0 and spliced.leyline["fallback"] is None
        fresh = await client.chat.completions.create(**kw)  # no session: exact KV only
        assert fresh.leyline["approximate_tokens"] == 0
        # one layer: the spliced cache equals a fresh prefill, so the constrained greedy answer is the same
        assert spliced.leyline["completion_token_ids"] == fresh.leyline["completion_token_ids"]
        if fmt is JSON_SCHEMA:
            jsonschema.validate(json.loads(spliced.choices[0].message.content), SCHEMA)
