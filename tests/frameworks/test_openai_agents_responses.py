"""openai-agents' **default** model (``OpenAIResponsesModel``, the Responses API) on Leyline.

The agent is built as a new user builds it — ``Agent(model=..., tools=[...])`` with no model
class named — and run through ``OpenAIProvider(openai_client=...)``, the provider behind
``set_default_openai_client``: with ``AsyncLeyline`` (policies splicing across turns) and with a
plain ``AsyncOpenAI``. ``Runner.run`` and ``Runner.run_streamed`` both.

The model is ``tiny-gqa-long``: random, but its sampled replies end after a few tokens (the agents
SDK raises on an ``incomplete`` response, as on OpenAI). It never calls a tool by itself, so the
conversation starts with an earlier run's calls and outputs (how a resumed agent continues).
The oracle is the server's report: with ``AsyncLeyline`` one session, the stubbed old outputs
spliced (``rotated_tokens > 0``) on every evicting turn, no fallback; with the plain client, every
turn after the first served from cache (the server recognises the conversation by its last reply).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, RunConfig, Runner, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider

from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from tests.e2e.server_helpers import make_service, running_server
from tests.frameworks.test_openai_agents import check_spliced, earlier_run, read_file

set_tracing_disabled(True)  # no trace exporter: nothing leaves the machine
MODEL = "tiny-gqa-long"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(make_service(MODEL, kv_budget_mb=64, default_max_tokens=64)) as url:
        yield url + "/v1"


def default_agent() -> Agent:
    """What the agents SDK's quickstart builds: a model name, a function tool."""
    return Agent(name="reader", instructions="Read the files you are asked about.", model=MODEL,
                 tools=[read_file], model_settings=ModelSettings(temperature=1.0))  # fmt: skip


async def run_turns(
    client: openai.AsyncOpenAI, items: list[Any], turns: int, streamed: bool, answers: list[Any] | None = None
) -> list[Any]:
    """``turns`` user turns, each a run of the default agent on the conversation so far (each
    model response's ``ModelResponse`` appended to ``answers``)."""
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    agent = default_agent()
    for turn in range(turns):
        items = [*items, {"role": "user", "content": f"Now look at src/t{turn}.py."}]
        if streamed:
            result = Runner.run_streamed(agent, items, max_turns=4, run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, items, max_turns=4, run_config=config)
        assert isinstance(result.final_output, str)
        items = result.to_input_list()
        if answers is not None:
            answers += result.raw_responses
    return items


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_default_model_through_asyncleyline_splices_its_policies_edits(server, streamed):
    client = AsyncLeyline(base_url=server, api_key="x", policies=[TruncateOlderThanN(2)])
    items = await run_turns(client, earlier_run(6), turns=3, streamed=streamed)
    assert sum(1 for item in items if item.get("type") == "function_call_output") == 6
    check_spliced(client, evictions=2)
    await client.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_default_model_through_a_plain_client_is_served_from_cache(server, streamed):
    answers: list[Any] = []
    client = openai.AsyncOpenAI(base_url=server, api_key="x")
    await run_turns(client, earlier_run(3), turns=3, streamed=streamed, answers=answers)
    assert len(answers) == 3
    prompts = [a.usage.input_tokens for a in answers]
    cached = [a.usage.input_tokens_details.cached_tokens for a in answers]  # reused + rotated (0: exact)
    for before, reused in zip(prompts, cached[1:], strict=False):
        assert reused >= before, (prompts, cached)  # the previous turn's prompt: a hit
    await client.close()
