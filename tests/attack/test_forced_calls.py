"""Forced tool calls answer with calls, and call framing never reaches ``content``.

The hardening issue's findings: a forced call (``tool_choice: "required"`` or a named function)
was refused on a template without call syntax, and a forced call cut short came back with
``content: "<tool_call>{"`` beside the parsed ``tool_calls``. Here every forced request, at
``max_tokens`` from too short for one call to room for several, is read by openai's own client:
the content never holds call framing, and an answer that was not cut short holds at least one
call of the forced tool whose arguments are JSON matching its schema.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.attack.helpers import MODEL, serve, service

SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2, 3]}},
          "required": ["city"], "additionalProperties": False}  # fmt: skip
# (max_tokens, parallel_tool_calls): cut inside a first call, inside later ones, and with room to finish
RUNS = [(4, True), (9, True), (16, True), (30, True), (60, True), (120, True), (200, False)]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
FRAMING = ("<tool_call>", "</tool_call>", '{"name"')


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_calls_never_leak_framing_into_content(engine, choice):
    with serve(service(engine)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        finished = 0
        for max_tokens, parallel in RUNS:
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                tool_choice=choice, max_tokens=max_tokens, temperature=0, parallel_tool_calls=parallel,
            )  # fmt: skip
            choice_ = answer.choices[0]
            content = choice_.message.content or ""
            assert not any(f in content for f in FRAMING), (max_tokens, content)
            if choice_.finish_reason == "length":
                continue
            calls = choice_.message.tool_calls or []
            assert calls, (max_tokens, answer)
            finished += 1
            for call in calls:
                if isinstance(choice, dict):
                    assert call.function.name == "get_weather"
                if call.function.name == "get_weather":
                    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
        assert finished, "every answer was cut short: no call was checked"
