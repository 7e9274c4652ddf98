"""The messages Leyline sends are the ones openai sends: openai's own transform and request body are the oracle.

``AsyncLeyline`` hands the effective messages to openai through ``extra_body`` (skipping openai's
per-message transform, ~80 ms at 500 messages); these tests hold that the bytes on the wire do
not change for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx
import openai
import pytest
from openai._utils import maybe_transform
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionMessageToolCall

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_sdk import AsyncLeyline
from leyline_sdk.client.calls import wire_messages

TOOL_CALL = ChatCompletionMessageToolCall.model_validate(
    {"id": "c9", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
)
MESSAGES: list[dict[str, Any]] = [
    SYSTEM,
    TASK,
    *agent_turn(0),
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},  # a pydantic object inside a dict
    {"role": "tool", "tool_call_id": "c9", "content": "x = 1", "name": openai.omit},  # an omitted field
    {"role": "user", "content": "done?", "name": "ann"},
    {"role": "user", "content": ({"type": "text", "text": "a tuple of parts"},)},  # an iterable, not a list
    {"role": "assistant", "content": "ok", "refusal": None, "audio": openai.NOT_GIVEN},  # null kept, not-given dropped
]


def test_wire_messages_are_openais_transform_of_them():
    expected = maybe_transform(MESSAGES, Iterable[ChatCompletionMessageParam])
    assert wire_messages([dict(m) for m in MESSAGES]) == expected
    assert expected[-5]["tool_calls"][0] == TOOL_CALL.model_dump(mode="json") and "name" not in expected[-4]


def recording_app(bodies: list[bytes]) -> Any:
    """A plain OpenAI server (no Leyline routes) that records every chat request body."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"].endswith("/chat/completions"):
            bodies.append(body)
            choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
            payload = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
            status, data = 200, payload
        else:
            status, data = 404, {"detail": "Not Found"}
        raw = json.dumps(data).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})

    return app


@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_body_is_byte_for_byte_openais(stream):
    sent: dict[str, list[bytes]] = {"openai": [], "leyline": []}
    kwargs: dict[str, Any] = {
        "model": "m",
        "messages": MESSAGES,
        "tools": TOOLS,
        "temperature": 0.5,
        "stop": openai.omit,
        "extra_body": {"seed": 3},
    }
    for name, make in (("openai", openai.AsyncOpenAI), ("leyline", AsyncLeyline)):
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=recording_app(sent[name])))
        client = make(base_url="http://plain/v1", api_key="k", http_client=http)
        if stream:  # the recording server answers JSON: only the request matters here
            await (await client.chat.completions.create(stream=True, **kwargs)).close()
        else:
            await client.chat.completions.create(**kwargs)
        await client.close()
    assert sent["leyline"] == sent["openai"] and len(sent["openai"]) == 1


async def test_a_history_with_objects_inside_is_one_session():
    bodies: list[bytes] = []
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=recording_app(bodies)))
    client = AsyncLeyline(base_url="http://plain/v1", http_client=http)
    messages = list(MESSAGES)
    for turn in range(3):  # the agent keeps the pydantic tool call in its history, turn after turn
        await client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "user", "content": f"turn {turn}"})
    assert len(client.sessions) == 1 and len(bodies) == 3
    await client.close()
