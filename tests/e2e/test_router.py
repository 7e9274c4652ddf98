"""Leyline replicas behind SGLang's router (the ``sglang-router`` wheel, a real Rust binary).

Two replicas of the tiny preset on loopback ports, the router in front with ``--policy manual``
(a routing key pins a conversation to one replica). The oracles: the splice counts a direct
request gets (``tests/e2e/test_gateway_carrier.py``), and each replica's own session table,
read directly, for where a conversation lives.
"""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from examples.cluster import router
from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import HFChatTokenizer, Leyline
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_sdk.session.gateway import SGLANG_ROUTER
from tests.e2e.server_helpers import make_service, running_server
from tests.e2e.test_gateway_carrier import KEY, two_turns

ROUTING = "X-SMG-Routing-Key"


@pytest.fixture(scope="module")
def cluster():
    with (
        running_server(make_service(api_keys=frozenset({KEY}))) as a,
        running_server(make_service(api_keys=frozenset({KEY}))) as b,
        router([a, b], "tiny-mla", "manual", api_key=KEY) as url,
    ):
        yield url, (a, b)


def routed(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, default_headers={ROUTING: key})


def holders(replicas, session_id: str) -> list[str]:
    """The replicas whose own session table holds ``session_id``."""
    auth = {"Authorization": f"Bearer {KEY}"}
    return [r for r in replicas if httpx.get(f"{r}/v1/leyline/sessions/{session_id}", headers=auth).status_code == 200]


async def test_a_splice_through_the_router_applies_on_the_pinned_replica(cluster):
    url, replicas = cluster
    async with routed(url, "agent-1") as client:
        first, second = await two_turns(client, replicas[0], "metadata")
    ext = second.leyline
    assert ext["session_id"] == first.leyline["session_id"] is not None
    assert ext["applied"] and ext["fallback"] is None and ext["rotated_tokens"] > 0, ext
    assert len(holders(replicas, ext["session_id"])) == 1


async def test_each_routing_key_stays_on_one_replica(cluster):
    url, replicas = cluster
    placement: dict[str, set[str]] = {}
    for key in [f"agent-{i}" for i in range(6)]:
        for _ in range(3):
            async with routed(url, key) as client:
                reply = await client.chat.completions.create(
                    model="tiny-mla",
                    messages=[{"role": "user", "content": f"task {key}"}],
                    max_tokens=1,
                    extra_body={"metadata": {"leyline": "{}"}},
                )
            placement.setdefault(key, set()).update(holders(replicas, reply.leyline["session_id"]))
    assert all(len(where) == 1 for where in placement.values()), placement


async def test_the_router_does_not_proxy_leyline_routes(cluster):
    """Why a client behind the router needs nothing but /v1/chat/completions."""
    url, _ = cluster
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = await http.post("/v1/leyline/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404


def test_a_blocking_client_finds_the_router_and_splices_through_it(cluster, caplog):
    """No ``behind_router``: the 404 on ``/v1/leyline/tokenize`` and the router's own answer switch it."""
    url, replicas = cluster
    caplog.set_level(logging.WARNING, logger="leyline_sdk")
    client = Leyline(
        base_url=url + "/v1",
        api_key=KEY,
        policies=[TruncateOlderThanN(2)],
        tokenizer=HFChatTokenizer(load_tiny_tokenizer()),
    )
    messages = [SYSTEM, TASK]
    for turn in range(5):
        client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=2)
        messages += agent_turn(turn)
    (session,) = client.sessions
    assert client.gateway is not None and client.gateway.routing_header == ROUTING
    assert [r.getMessage().startswith(SGLANG_ROUTER) for r in caplog.records] == [True]  # said once
    assert all(s.fallback is None for s in session.stats) and session.stats[-1].rotated_tokens > 0
    assert len(holders(replicas, session.session_id)) == 1
    client.close()
