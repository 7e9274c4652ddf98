"""No 500 from input (findings 5 and 6): what a JSON schema cannot express, by hand.

Each case is a request that once made the server answer 500 (or silently accept a wrong value);
each must now get a 4xx in OpenAI's error shape, naming the field where there is one, and the
server must keep serving. ``tests/e2e/test_server_fuzz.py`` covers what the schema can generate.
"""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from leyline_server.api.service import LeylineService, ServerConfig
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.factory import build_engine
from tests.attack.helpers import MODEL, serve

# SmolLM2-135M-Instruct's chat template, as its GGUF carries it: no tool syntax at all, so tools,
# tool calls and tool results are rendered as text (leyline_sdk.render.tool_text)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}


def smollm2_service(engine: str) -> LeylineService:
    built, tokenizer = build_engine(EngineConfig(engine=engine, model=MODEL, kv_budget_mb=8, context_length=4096))
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    config = ServerConfig(model_name=MODEL, max_context_tokens=4096, default_max_tokens=2)
    return LeylineService(built, tokenizer, config)


def chat(**fields) -> tuple[str, str, dict]:
    return "POST", "/v1/chat/completions", {"model": MODEL, "messages": [USER], "max_tokens": 2, **fields}


SURROGATE = "a\ud800b"  # a lone surrogate: json.dumps writes it as the escape \ud800


def nested_schema(levels: int) -> dict:
    """An object schema ``levels`` objects deep (twice as deep in JSON)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_list(levels: int) -> list:
    value: list = [1]
    for _ in range(levels):
        value = [value]
    return value


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


CASES = {
    # client JSON nested past what the recursive walkers take (round two's RecursionErrors)
    "carrier nested 60k deep": (chat(metadata={"leyline": "[" * 60_000 + "]" * 60_000}), None),
    "response_format 150 objects deep": (chat(response_format=json_schema(nested_schema(150))), "response_format"),
    "enum values 800 deep": (chat(response_format=json_schema({"enum": [nested_list(800)]})), "response_format"),
    "const value 800 deep": (chat(response_format=json_schema({"const": nested_list(800)})), "response_format"),
    "tool parameters 150 objects deep": (
        chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": nested_schema(150)}}],
            tool_choice="required",
        ),
        "tools.0",
    ),  # fmt: skip
    "logit_bias superscript two": (chat(logit_bias={"²": 5}), "logit_bias"),
    "logit_bias 5,000 digits": (chat(logit_bias={"1" * 5000: 5}), "logit_bias"),
    "seed 2**64": (chat(seed=2**64), "seed"),
    "seed below int64": (chat(seed=-(2**63) - 1), "seed"),
    "seed 2**64 streamed": (chat(seed=2**64, stream=True), "seed"),
    "surrogate in content": (chat(messages=[{"role": "user", "content": SURROGATE}]), "messages.0.content"),
    "surrogate in a content part": (
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]),
        "messages.0.content.0.text",
    ),
    "surrogate in a tool name": (
        chat(tools=[{"type": "function", "function": {"name": SURROGATE, "parameters": {}}}]),
        "tools.0.function.name",
    ),
    "surrogate in stop": (chat(stop=[SURROGATE]), "stop.0"),
    "surrogate in tokenize": (
        ("POST", "/v1/leyline/tokenize", {"messages": [{"role": "user", "content": SURROGATE}]}),
        "messages.0.content",
    ),  # fmt: skip
    "surrogate in a session": (
        ("POST", "/v1/leyline/sessions", {"messages": [{"role": "user", "content": SURROGATE}]}),
        "messages.0.content",
    ),  # fmt: skip
    "surrogate in a block": (
        ("POST", "/v1/leyline/blocks", {"messages": [{"role": "user", "content": SURROGATE}]}),
        "messages.0.content",
    ),  # fmt: skip
    "surrogate in a key": (chat(metadata={SURROGATE: "x"}), "metadata.a\\ud800b"),
    "replacement [true]": (
        chat(leyline={"directives": [{"start": 0, "end": 0, "replacement": [True]}]}),
        "leyline.directives.0.replacement.0",
    ),  # fmt: skip
    "session tokens [true]": (("POST", "/v1/leyline/sessions", {"tokens": [True, 5]}), "tokens.0"),
    "block tokens [false]": (("POST", "/v1/leyline/blocks", {"tokens": [5, False]}), "tokens.1"),
    "start true": (chat(leyline={"directives": [{"start": True, "end": 1}]}), "leyline.directives.0.start"),
    "max_tokens 10**30": (chat(max_tokens=10**30), "messages"),
    "n 10**30": (chat(n=10**30), "n"),
    "top_logprobs 10**30": (chat(logprobs=True, top_logprobs=10**30), "top_logprobs"),
    "tokens 2**70": (("POST", "/v1/leyline/sessions", {"tokens": [2**70]}), "tokens"),
}


async def _send(c: httpx.AsyncClient, method: str, path: str, body: object) -> httpx.Response:
    return await c.request(method, path, content=json.dumps(body), headers={"Content-Type": "application/json"})


def _is_openai_error(r: httpx.Response) -> dict:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"type", "code", "message", "param"} and error["message"], error
    return error


async def test_every_input_that_once_gave_a_500_is_a_4xx_naming_its_field(engine):
    svc = smollm2_service(engine)
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            sid = (await c.post("/v1/leyline/sessions", json={"tokens": list(range(5, 60))})).json()["id"]
            cases = dict(CASES)
            cases["session replacement [true]"] = (
                ("POST", f"/v1/leyline/sessions/{sid}/directives",
                 {"directives": [{"start": 1, "end": 2, "replacement": [True]}]}),
                "directives.0.replacement.0",
            )  # fmt: skip
            cases["tool_calls garbage (no tool syntax)"] = (
                chat(messages=[USER, {"role": "assistant", "content": "", "tool_calls": "garbage"}, USER]),
                "messages",
            )
            cases["tool_calls of strings"] = (
                ("POST", "/v1/leyline/tokenize",
                 {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": ["x"]}]}),
                "messages",
            )  # fmt: skip
            failures = {}
            for name, ((method, path, body), param) in cases.items():
                r = await _send(c, method, path, body)
                try:
                    error = _is_openai_error(r)
                    assert error["param"] == param, (error["param"], param)
                except AssertionError as exc:
                    failures[name] = f"{r.status_code} {r.text[:300]} ({exc})"
            assert not failures, json.dumps(failures, indent=1, ensure_ascii=True)
            # tools render as text on this template: a well-formed request is served
            ok = await _send(c, *chat(tools=[TOOL], messages=[USER])[:2], chat(tools=[TOOL])[2])
            assert ok.status_code == 200, ok.text
            assert (await c.get("/health")).status_code == 200


async def test_bodies_no_parser_likes_are_4xx(engine):
    svc = smollm2_service(engine)
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            json_type = {"Content-Type": "application/json"}
            bodies = [
                b"[" * 100_000 + b"]" * 100_000,  # nesting past any recursion limit
                b'{"model": "tiny-gqa", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # not UTF-8
                b'{"model": "tiny-gqa", "messages": [{"role": "user", "content": "\\ud800\\u0041"}]}',
                b'{"model": "tiny-gqa", "messages": [{"role": "user", "content": "\\udc00"}]}',
                b'{"model": "tiny-gqa", "messages": NaN}',
                b"\xff\xfe{}",
                b"",
            ]
            for path in ("/v1/chat/completions", "/v1/leyline/tokenize", "/v1/leyline/sessions", "/v1/leyline/blocks"):
                for body in bodies:
                    _is_openai_error(await c.post(path, content=body, headers=json_type))
            # a valid pair is text, not a surrogate
            pair = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00 and \\\\ud800 as text"}]}'
            assert (await c.post("/v1/leyline/tokenize", content=pair, headers=json_type)).status_code == 200
            # odd headers are just headers
            r = await c.get("/v1/models", headers={"X-Custom": "é".encode("latin-1"), "Accept-Language": b"\xff"})
            assert r.status_code == 200, r.text
            _is_openai_error(await c.get("/v1/leyline/sessions/%ED%A0%80"))
            _is_openai_error(await c.delete("/v1/leyline/blocks/" + "x" * 5000))
            assert (await c.get("/health")).status_code == 200


# Content parts the model cannot take and tools that are not functions are refused by name.
@pytest.mark.parametrize(
    "fields",
    [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
        {"tools": [{}]},
        {"tools": [{"type": "code_interpreter"}]},
    ],
    ids=["image_url part", "tools [{}]", "non-function tool"],
)
async def test_unsupported_content_and_tools_are_refused(fields):
    svc = smollm2_service("embedded")
    with serve(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            error = _is_openai_error(await _send(c, *chat(**fields)))
            assert error["param"].startswith(next(iter(fields))), error
