"""Many SDK agents behind SGLang's router: sessions pinned to replicas, then failover with nothing lost.

Three replicas of the tiny preset on loopback ports and the real router (the ``sglang-router``
wheel's Rust binary, ``--policy manual``) in front. One :class:`AsyncLeyline` client, built
without ``behind_router``: it finds the router from the 404 on ``/v1/leyline/tokenize`` and from
then on sends each session's routing key and the extension in ``metadata["leyline"]``, rendering
with the local tokenizer. ``AGENTS`` agents run ``TURNS`` turns each with ``TruncateOlderThanN(2)``.

Oracles: each replica's own session table, read directly (where a session lives); the response's
``leyline`` field (every directive applied, no fallback); and one plain server driven with the same
conversations by a client without a router, whose answers at temperature 0 every routed answer
must equal — also on the turn the failover answered in full on another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from examples.cluster import router
from examples.trace import SYSTEM, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, HFChatTokenizer
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_sdk.session.gateway import SGLANG_ROUTER
from tests.e2e.server_helpers import make_service, running_server

AGENTS, TURNS, KILL_AFTER = 12, 6, 4  # 12 x 6 fit in about a minute on two cores
MODEL = "tiny-mla"


def service() -> Any:
    return make_service(kv_budget_mb=64)


def task(agent: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Agent {agent}: find where module {agent} parses its configuration."}


def holders(replicas: list[str], session_id: str) -> list[str]:
    """The replicas whose own session table holds ``session_id``."""
    return [r for r in replicas if httpx.get(f"{r}/v1/leyline/sessions/{session_id}").status_code == 200]


class Agent:
    """One scripted agent: a session, its conversation, and what each turn answered."""

    def __init__(self, client: AsyncLeyline, index: int) -> None:
        self.session = client.session(tools=TOOLS)
        self.messages: list[dict[str, Any]] = [SYSTEM, task(index)]
        self.answers: list[str] = []
        self.results: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []

    async def turns(self, first: int, last: int) -> None:
        """Turns ``first``..``last - 1``; an exception is recorded (none may reach an agent)."""
        for turn in range(first, last):
            try:
                r = await self.session.create(model=MODEL, messages=self.messages, max_tokens=4, temperature=0)
            except Exception as exc:  # the assertion is that this list stays empty
                self.errors.append(exc)
                return
            self.answers.append(r.choices[0].message.content or "")
            self.results.append(r.leyline)
            self.messages += agent_turn(turn, lines=12)


async def run_oracle(url: str, lost: set[int]) -> list[Agent]:
    """The same conversations on one plain server, with a client that sees no router.

    The sessions of the agents in ``lost`` are dropped on the server after ``KILL_AFTER`` turns,
    as a server restart would drop them: their next turn is a ``base_mismatch`` answered in full
    there too (``amortize`` KV is not bit-equal to a fresh prefill, so a failover turn is compared
    with the full answer a single server gives, not with a splice it never made).
    """
    client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)], tokenizer=tiny_chat())
    agents = [Agent(client, i) for i in range(AGENTS)]
    await asyncio.gather(*(a.turns(0, KILL_AFTER) for a in agents))
    async with httpx.AsyncClient(base_url=url) as http:
        for i in sorted(lost):
            assert (await http.delete(f"/v1/leyline/sessions/{agents[i].session.session_id}")).status_code == 200
    await asyncio.gather(*(a.turns(KILL_AFTER, TURNS) for a in agents))
    await client.close()
    assert not any(a.errors for a in agents)
    return agents


def tiny_chat() -> HFChatTokenizer:
    return HFChatTokenizer(load_tiny_tokenizer())


async def test_agents_behind_the_router_stay_put_then_fail_over(caplog):
    caplog.set_level(logging.WARNING, logger="leyline_sdk")
    with contextlib.ExitStack() as stack:
        stops = [contextlib.ExitStack() for _ in range(3)]
        replicas = [s.enter_context(running_server(service())) for s in stops]
        for s in stops:
            stack.callback(s.close)
        url = stack.enter_context(router(replicas, MODEL))
        client = AsyncLeyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)], tokenizer=tiny_chat())
        agents = [Agent(client, i) for i in range(AGENTS)]

        await asyncio.gather(*(a.turns(0, KILL_AFTER) for a in agents))
        assert client.gateway is not None and client.gateway.name == SGLANG_ROUTER
        said = [r.message for r in caplog.records if r.name.startswith("leyline_sdk")]
        assert len(said) == 1 and SGLANG_ROUTER in said[0], said  # said once
        placement = {i: holders(replicas, a.session.session_id) for i, a in enumerate(agents)}
        assert all(len(where) == 1 for where in placement.values()), placement
        for a in agents:
            assert not a.errors and len({r["session_id"] for r in a.results}) == 1
            assert all(r["applied"] and r["fallback"] is None for r in a.results), a.results
            assert all(s.fallback is None for s in a.session.stats)
            assert a.session.stats[-1].policy_directives > 0 and a.session.stats[-1].rotated_tokens > 0

        load = {r: sum(where == [r] for where in placement.values()) for r in replicas}
        victim = max(load, key=lambda r: load[r])
        lost = {i for i in range(AGENTS) if placement[i] == [victim]}
        moved = [agents[i] for i in sorted(lost)]
        stops[replicas.index(victim)].close()  # mid-conversation; the router has not noticed yet
        await asyncio.gather(*(a.turns(KILL_AFTER, TURNS) for a in agents))

        for a in agents:
            assert not a.errors, a.errors
            assert len(a.answers) == TURNS
        assert moved
        for a in moved:  # one forget on the new replica, answered in full; then it splices again
            assert [s.fallback for s in a.session.stats][KILL_AFTER:] == ["base_mismatch", None]
            assert a.results[KILL_AFTER]["session_id"] != a.results[0]["session_id"]
            assert a.results[-1]["applied"] and a.session.stats[-1].rotated_tokens > 0
            assert len(holders([r for r in replicas if r != victim], a.session.session_id)) == 1
        assert all(all(s.fallback is None for s in a.session.stats) for a in agents if a not in moved)

    with running_server(service()) as single:
        oracle = await run_oracle(single, lost)
    assert [[s.fallback for s in a.session.stats] for a in oracle] == [
        [s.fallback for s in a.session.stats] for a in agents
    ]
    assert [a.answers for a in agents] == [a.answers for a in oracle]
