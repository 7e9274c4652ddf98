"""``/v1/messages`` in process (the real app on the tiny preset): what the e2e tests with the
anthropic SDK do not reach — structured output, ``tool_choice: none``, ``count_tokens`` with
context edits, the guard's refusals in Anthropic's shape, the request id. Answers are parsed with
anthropic's own ``Message`` type."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message
from fastapi.testclient import TestClient

from tests.e2e.server_helpers import make_service

MODEL = "tiny-mla"
KEY = "sk-in-process"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
NEXT = {"name": "read_next", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def http():
    from leyline_server.api.app import create_app

    service = make_service(MODEL, kv_budget_mb=32, api_keys=frozenset({KEY}), max_body_bytes=200_000)
    with TestClient(create_app(service)) as client:
        yield client


def post(http: TestClient, path: str = "/v1/messages", headers: dict[str, str] = HEADERS, **body):
    full = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **body}
    return http.post(path, json=full, headers=headers)


def test_output_config_json_schema_is_decoded_under_the_grammar(http):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "boolean"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    got = post(http, max_tokens=24, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert got.status_code == 200, got.text
    (block,) = Message.model_validate(got.json()).content
    value = json.loads(block.text)  # type: ignore[union-attr]
    assert set(value) == {"n"} and isinstance(value["n"], bool)


def test_tool_choice_none_never_calls(http):
    got = post(http, tools=[NEXT], tool_choice={"type": "none"}, temperature=0)
    message = Message.model_validate(got.json())
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "max_tokens"


def test_count_tokens_after_the_context_edits(http):
    messages = [{"role": "user", "content": "go"}]
    for i in range(4):
        use = {"type": "tool_use", "id": f"c{i}", "name": "read_next", "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"c{i}", "content": "value = 1\n" * 40}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    edits = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
                        "keep": {"type": "tool_uses", "value": 1}}]}  # fmt: skip
    body = {"model": MODEL, "messages": messages, "tools": [NEXT]}
    plain = http.post("/v1/messages/count_tokens", json=body, headers=HEADERS).json()
    edited = http.post("/v1/messages/count_tokens", json={**body, "context_management": edits}, headers=HEADERS).json()
    assert edited["context_management"]["original_input_tokens"] == plain["input_tokens"]
    assert edited["input_tokens"] < plain["input_tokens"]
    answer = post(http, messages=messages, tools=[NEXT], context_management=edits, max_tokens=2).json()
    usage = answer["usage"]
    assert (
        usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        == (edited["input_tokens"])
    )
    assert answer["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 3


def test_the_guards_refusals_come_in_anthropics_shape(http):
    missing = post(http, headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 401
    assert missing.json()["type"] == "error" and missing.json()["error"]["type"] == "authentication_error"
    bearer = post(http, headers={"Authorization": f"Bearer {KEY}"})
    assert bearer.status_code == 200  # either header carries the key
    too_big = post(http, messages=[{"role": "user", "content": "x" * 300_000}])
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "request_too_large"
    assert too_big.headers["request-id"] == too_big.headers["x-request-id"]
    unknown = post(http, model="nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    chat = http.post("/v1/chat/completions", json={"model": "nope", "messages": []}, headers=HEADERS)
    assert "error" in chat.json() and "type" not in chat.json()  # other routes keep OpenAI's shape


def test_sampling_fields_and_thinking_are_accepted(http):
    got = post(http, top_k=5, top_p=0.9, temperature=0.5, thinking={"type": "adaptive"},
               output_config={"effort": "high"}, metadata={"user_id": "someone"}, stop_sequences=["\n\n"])  # fmt: skip
    assert got.status_code == 200, got.text
    assert Message.model_validate(got.json()).stop_reason in ("max_tokens", "end_turn", "stop_sequence")
