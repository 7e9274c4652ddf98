"""``/v1/responses`` in process (the real app on the tiny preset): what the e2e tests with openai's
client do not reach — hosted tools, forced calls and their events, structured output,
``truncation``, ``store: false``, ``item_reference``, limits and errors in the Responses shape.
Every answer is also parsed with openai's own ``Response`` type."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types.responses import Response, ResponseFunctionToolCall

from tests.e2e.server_helpers import make_service

MODEL = "tiny-mla"
READ = {"type": "function", "name": "read", "description": "Read.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}, "strict": True}  # fmt: skip


@pytest.fixture(scope="module")
def http():
    from leyline_server.api.app import create_app

    with TestClient(create_app(make_service(MODEL, kv_budget_mb=32, max_context_tokens=512))) as client:
        yield client


def create(http: TestClient, **body: Any) -> tuple[Any, dict[str, Any]]:
    got = http.post("/v1/responses", json={"model": MODEL, "temperature": 0, **body})
    return got, got.json()


def events(http: TestClient, **body: Any) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/responses", json={"model": MODEL, "stream": True, "temperature": 0, **body}) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines]


def test_hosted_tools_are_not_offered_and_said_so(http):
    got, body = create(http, input="hi", tools=[{"type": "web_search"}, READ], max_output_tokens=4)
    assert got.status_code == 200 and got.headers["x-leyline-tools-not-offered"] == "web_search"
    Response.model_validate(body)
    refused, error = create(http, input="hi", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"})
    assert refused.status_code == 400 and error["error"]["param"] == "tool_choice"


def test_a_forced_call_streams_its_argument_events_and_item(http):
    namespaced = {"type": "namespace", "name": "fs", "tools": [READ]}
    seen = events(http, input="go", tools=[namespaced], tool_choice="required", max_output_tokens=32,
                  parallel_tool_calls=False)  # fmt: skip
    kinds = [e["type"] for e in seen]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = [
        e["item"] for e in seen if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
    ]
    assert len(done) == 1 and done[0]["name"] == "read" and done[0]["namespace"] == "fs"
    assert json.loads(done[0]["arguments"]) == {}
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    (item,) = seen[-1]["response"]["output"]  # (openai-python 3.57's Response has no namespace tools)
    assert ResponseFunctionToolCall.model_validate(item).call_id == done[0]["call_id"]


def test_text_format_json_schema_is_decoded_under_the_grammar(http):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "boolean"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}
    got, body = create(http, input="a number", text=fmt, max_output_tokens=24)
    assert got.status_code == 200, body
    value = json.loads(Response.model_validate(body).output_text)
    assert isinstance(value, dict) and set(value) == {"n"} and isinstance(value["n"], bool)


def long_conversation(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i} " + "word " * 30},
                {"role": "assistant", "content": f"answer {i} " + "word " * 30}]  # fmt: skip
    return [*out, {"role": "user", "content": "last"}]


def test_truncation_auto_drops_the_oldest_exchanges_and_says_how_many(http):
    items = long_conversation(12)  # far past the 512-token context
    refused, error = create(http, input=items, max_output_tokens=4)
    assert refused.status_code == 400 and error["error"]["code"] == "context_length_exceeded"
    got, body = create(http, input=items, max_output_tokens=4, truncation="auto")
    assert got.status_code == 200, body
    dropped = int(got.headers["x-leyline-truncated-messages"])
    assert 0 < dropped < len(items)
    assert body["usage"]["input_tokens"] + 4 <= 512
    streamed = events(http, input=items, max_output_tokens=4)
    assert [e["type"] for e in streamed] == ["response.created", "response.failed"]
    assert streamed[-1]["response"]["error"]["code"] == "context_length_exceeded"
    body = {"model": MODEL, "input": items, "max_output_tokens": 4, "truncation": "auto", "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as r:  # found before the stream starts: a header
        assert r.status_code == 200 and int(r.headers["x-leyline-truncated-messages"]) == dropped
        final = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")][-1]["response"]
    assert final["status"] in ("completed", "incomplete") and final["usage"]["input_tokens"] + 4 <= 512


def test_store_false_keeps_nothing_and_item_references_resolve(http):
    got, body = create(http, input="keep me not", store=False, max_output_tokens=3)
    assert got.status_code == 200 and http.get(f"/v1/responses/{body['id']}").status_code == 404
    _, stored = create(http, input="remember", max_output_tokens=3)
    message = stored["output"][0]
    ref = [{"type": "item_reference", "id": message["id"]}, {"role": "user", "content": "next"}]
    _, by_ref = create(http, input=ref, max_output_tokens=3)
    _, by_value = create(http, input=[{"role": "assistant", "content": message["content"][0]["text"]},
                                      {"role": "user", "content": "next"}], max_output_tokens=3)  # fmt: skip
    assert by_ref["usage"]["input_tokens"] == by_value["usage"]["input_tokens"]
    assert by_ref["output"][0]["content"][0]["text"] == by_value["output"][0]["content"][0]["text"]
    missing, error = create(http, input=[{"type": "item_reference", "id": "msg_nope"}])
    assert missing.status_code == 404 and error["error"]["code"] == "item_not_found"


def test_a_length_stop_is_incomplete_and_echoes_the_request(http):
    got, body = create(http, input="hi", instructions="Short.", max_output_tokens=2, metadata={"run": "1"})
    response = Response.model_validate(body)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.instructions == "Short." and response.metadata == {"run": "1"}
    assert response.usage is not None and response.usage.output_tokens == 2


def test_errors_come_in_the_responses_shape(http):
    got, body = create(http, model="nope", input="x")
    assert got.status_code == 404 and body["error"]["code"] == "model_not_found"
    got, body = create(http, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert got.status_code == 400 and body["error"]["param"] == "input.0.content.0.type"


def test_logprobs_reasoning_and_the_sampling_fields(http):
    fields = {"top_logprobs": 2, "reasoning": {"effort": "high"}, "top_p": 0.9, "user": "u1",
              "include": ["message.output_text.logprobs"], "prompt_cache_key": "conv-1"}  # fmt: skip
    got, body = create(http, input="hi", max_output_tokens=3, **fields)
    assert got.status_code == 200, body
    response = Response.model_validate(body)
    logprobs = response.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert logprobs is not None and len(logprobs) == 3 and all(len(e.top_logprobs) == 2 for e in logprobs)
    assert response.reasoning is not None and response.reasoning.effort == "high"  # echoed; no switch on this template
