"""The SDK's gateway mode (``behind_router=True``) against a real server, every request recorded.

What a gateway such as SGLang's router lets through is the oracle: only ``/v1/chat/completions``,
OpenAI's ``metadata`` map and one routing header. The client must splice with nothing else, keep
the caller's own metadata, and give each session one stable routing key of its own.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, HFChatTokenizer, Leyline
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from tests.e2e.server_helpers import make_service, running_server

HEADER = "X-Gateway-Key"


def carried(request: httpx.Request) -> dict:
    return json.loads(request.content)


def gateway_client(url: str, seen: list[httpx.Request], blocking: bool = False, **options: Any) -> Any:
    """A client behind a gateway at ``url`` (the tiny tokenizer renders) that records every request in ``seen``."""
    common = {"base_url": url + "/v1", "tokenizer": HFChatTokenizer(load_tiny_tokenizer()), "behind_router": True}
    if blocking:
        return Leyline(**common, http_client=httpx.Client(event_hooks={"request": [seen.append]}), **options)

    async def record(request: httpx.Request) -> None:
        seen.append(request)

    return AsyncLeyline(**common, http_client=httpx.AsyncClient(event_hooks={"request": [record]}), **options)


async def test_gateway_mode_uses_only_chat_completions_and_one_key_per_session():
    seen: list[httpx.Request] = []
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = gateway_client(url, seen, policies=[TruncateOlderThanN(2)], routing_header=HEADER)
        assert client.gateway is not None and client.gateway.routing_header == HEADER
        one, two = client.session(tools=TOOLS), client.session(tools=TOOLS)
        messages = [SYSTEM, TASK]
        for turn in range(5):
            for session in (one, two):
                r = await session.create(model="tiny-mla", messages=messages, max_tokens=2, metadata={"team": "a"})
                assert r.leyline["session_id"] == session.session_id
            if turn == 3:
                assert await one.sync_edits() is None  # no route for it: the next turn carries the edits
            messages += agent_turn(turn)
        opened = one.session_id
        await client.close()  # nothing to delete behind a gateway

    assert {r.url.path for r in seen} == {"/v1/chat/completions"} and len(seen) == 10
    keys = [r.headers[HEADER] for r in seen]
    assert len(set(keys[0::2])) == len(set(keys[1::2])) == 1 and keys[0] != keys[1]
    assert keys[0] == one.routing_key and keys[1] == two.routing_key
    bodies = [carried(r) for r in seen]
    assert all("leyline" not in b and b["metadata"]["team"] == "a" for b in bodies)
    extensions = [json.loads(b["metadata"]["leyline"]) for b in bodies]
    assert "session_id" not in extensions[0]  # the first chat opens the session
    assert all(e["session_id"] == opened for e in extensions[2::2])
    for session in (one, two):
        assert all(s.fallback is None for s in session.stats)
        assert session.stats[-1].policy_directives > 0 and session.stats[-1].rotated_tokens > 0


def test_blocking_client_behind_a_gateway_splices_through_metadata():
    seen: list[httpx.Request] = []
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = gateway_client(url, seen, blocking=True, policies=[TruncateOlderThanN(2)])
        messages = [SYSTEM, TASK]
        for turn in range(4):
            client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=2)
            messages += agent_turn(turn)
        (session,) = client.sessions
        assert all(s.fallback is None for s in session.stats) and session.stats[-1].rotated_tokens > 0
        client.close()
    assert {r.url.path for r in seen} == {"/v1/chat/completions"}
    assert {r.headers["X-SMG-Routing-Key"] for r in seen} == {session.routing_key}


async def test_a_block_message_behind_a_gateway_is_prefilled_not_placed():
    """``/v1/leyline/blocks`` is out of reach behind a gateway: the block message is an ordinary one."""
    seen: list[httpx.Request] = []
    skill = {"role": "user", "content": "Skill: read files before editing them.", "leyline_block": True}
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = gateway_client(url, seen)
        session = client.session(tools=TOOLS)
        turns = [[SYSTEM, TASK], [SYSTEM, TASK, *agent_turn(0), skill]]
        for messages in turns:
            await session.create(model="tiny-mla", messages=messages, max_tokens=2)
        await client.close()
    assert {r.url.path for r in seen} == {"/v1/chat/completions"}
    assert session.stats[1].block_fallback == "gateway" and session.stats[1].fallback is None
    assert "leyline_block" not in carried(seen[1])["messages"][-1]
