"""openai-agents and LangChain asking for structured output and forced tools.

Each test runs twice: through a plain ``openai.AsyncOpenAI`` and through ``AsyncLeyline`` (every
call then goes through a Leyline session, so the grammar applies on a session's turns too).

The model is a random tiny preset: the typed answers below exist only because the server decodes
under the schema (openai-agents' ``output_type``, LangChain's ``with_structured_output`` with
``json_schema`` and ``function_calling``) or forces the call (``tool_choice``).
"""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-gqa"
QUESTION = "Is it sunny in Paris? Give a verdict."


class Verdict(BaseModel):
    """A typed answer (every field required, no extras: strict-mode schemas)."""

    answer: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)
    sure: bool


@pytest.fixture(scope="module")
def server():
    with running_server(make_service(MODEL, layers=1)) as url:
        yield url


@pytest.fixture(params=["openai", "leyline"])
def client(server, request):
    if request.param == "leyline":
        from leyline_sdk import AsyncLeyline

        return AsyncLeyline(base_url=server + "/v1", api_key="unused", max_retries=0)
    return openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


async def test_openai_agents_output_type_and_required_tool_choice(client):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    settings = ModelSettings(temperature=0, max_tokens=64)
    judge = Agent(name="judge", instructions="Answer.", output_type=Verdict, model=model, model_settings=settings)
    result = await Runner.run(judge, QUESTION)
    assert isinstance(result.final_output, Verdict)

    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    forced = ModelSettings(temperature=0, max_tokens=64, tool_choice="required")
    agent = Agent(
        name="forecaster",
        instructions="Use the tool.",
        tools=[get_weather],
        model=model,
        model_settings=forced,
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, QUESTION)
    assert len(seen) == 1 and result.final_output == f"sunny in {seen[0]}"


def chat_model(client):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL,
        api_key="unused",
        base_url=str(client.base_url),
        root_async_client=client,
        async_client=client.chat.completions,
        temperature=0,
        max_tokens=64,
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_langchain_with_structured_output(client, method):
    llm = chat_model(client)
    verdict = await llm.with_structured_output(Verdict, method=method).ainvoke(QUESTION)
    assert isinstance(verdict, Verdict)


async def test_langchain_bind_tools_with_a_named_tool_choice(client):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        return city

    @tool
    def read_file(path: Literal["a.py", "b.py"]) -> str:
        """Read a file."""
        return path

    message = await chat_model(client).bind_tools([get_weather, read_file], tool_choice="read_file").ainvoke(QUESTION)
    assert [c["name"] for c in message.tool_calls] == ["read_file"]
    assert message.tool_calls[0]["args"]["path"] in ("a.py", "b.py")
