"""LiteLLM for real: pointed at the server, and through Leyline's clients where LiteLLM takes a client.

LiteLLM's OpenAI route posts its own request bodies with the client's ``post`` (it skips
``chat.completions.create``); Leyline's clients route any ``POST /chat/completions`` through a
session, so an agent loop run by LiteLLM is spliced turn after turn like any other.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list at import

import litellm  # noqa: E402
import pytest  # noqa: E402

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn  # noqa: E402
from leyline_policies import TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline, Leyline  # noqa: E402
from tests.frameworks.conftest import KEY, MODEL  # noqa: E402

litellm.telemetry = False


def assert_spliced(sessions: list) -> None:
    (session,) = sessions
    assert all(s.fallback is None for s in session.stats), [s.fallback for s in session.stats]
    evicting = [s for s in session.stats[1:] if s.cleared]
    assert evicting and all(s.rotated_tokens > 0 for s in evicting)


def test_litellm_pointed_at_the_server(server):
    messages = [SYSTEM, TASK, *agent_turn(0)]
    r = litellm.completion(model=f"openai/{MODEL}", api_base=server, api_key=KEY, messages=messages, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 0
    chunks = list(
        litellm.completion(
            model=f"openai/{MODEL}", api_base=server, api_key=KEY, messages=messages, max_tokens=4, stream=True
        )
    )
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "stream"])
def test_litellm_through_leyline_splices_the_agent_loop(server, stream):
    client = Leyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    messages = [SYSTEM, TASK]
    for turn in range(5):
        r = litellm.completion(
            model=f"openai/{MODEL}", client=client, messages=messages, tools=TOOLS, max_tokens=4, stream=stream
        )
        if stream:
            assert list(r)
        else:
            assert r.choices[0].finish_reason in ("stop", "length")
        messages += agent_turn(turn)
    assert_spliced(client.sessions)
    client.close()


async def test_litellm_acompletion_through_async_leyline(server):
    client = AsyncLeyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    messages = [SYSTEM, TASK]
    for turn in range(5):
        r = await litellm.acompletion(
            model=f"openai/{MODEL}", client=client, messages=messages, tools=TOOLS, max_tokens=4
        )
        assert r.choices[0].finish_reason in ("stop", "length")
        messages += agent_turn(turn)
    assert_spliced(client.sessions)
    await client.close()
