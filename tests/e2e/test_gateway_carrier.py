"""The ``leyline`` extension through ``metadata`` (what gateways keep), and the router's probes.

The oracle for the carrier is the ``leyline`` field itself: the same two-turn splice sent once
each way must give the same answers and the same splice counts.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from leyline_sdk.core.directives import Directive, apply
from tests.e2e.server_helpers import make_service, running_server

KEY = "sk-gateway"
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the file."},
    {"role": "assistant", "content": "Reading it now."},
    {"role": "user", "content": "def main():\n    return 1\n" * 12},
    {"role": "user", "content": "Now fix it."},
]


@pytest.fixture(scope="module")
def server():
    with running_server(make_service(api_keys=frozenset({KEY}))) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)


def carried(extension: dict, via: str) -> dict:
    """``extra_body`` sending ``extension`` in the ``leyline`` field or in ``metadata``."""
    if via == "field":
        return {"leyline": extension, "metadata": {"trace": "t1"}}
    return {"metadata": {"leyline": json.dumps(extension), "trace": "t1"}}


async def tokens_of(server, messages):
    async with httpx.AsyncClient(base_url=server, headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = await http.post("/v1/leyline/tokenize", json={"messages": messages})
        r.raise_for_status()
        return r.json()


async def two_turns(client, server, via: str):
    first = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=3, temperature=0, extra_body=carried({}, via)
    )
    ext = first.leyline
    base = (await tokens_of(server, MESSAGES))["tokens"] + ext["completion_token_ids"]
    old, new = await tokens_of(server, MESSAGES), None
    edited = [dict(m) for m in MESSAGES]
    edited[3]["content"] = "[evicted: 24 lines]"
    new = await tokens_of(server, edited)
    span, new_span = old["message_spans"][3], new["message_spans"][3]
    evict = Directive(
        start=span["start"], end=span["end"], replacement=new["tokens"][new_span["start"] : new_span["end"]]
    )
    follow_up = edited + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    prompt2 = (await tokens_of(server, follow_up))["tokens"]
    spliced = apply(base, [evict])
    c = next(i for i, (a, b) in enumerate(zip(spliced, prompt2, strict=False)) if a != b)
    directives = [evict, Directive(start=c - evict.delta, end=len(base), replacement=prompt2[c:])]
    extension = {
        "session_id": ext["session_id"],
        "base": ext["base"],
        "directives": [d.model_dump(mode="json") for d in directives],
    }
    second = await client.chat.completions.create(
        model="tiny-mla", messages=follow_up, max_tokens=4, temperature=0, extra_body=carried(extension, via)
    )
    return first, second


def comparable(response, radix_hit: bool = False) -> tuple:
    """What must not depend on the carrier (a first turn's prefix-cache hit depends on order)."""
    skip = {"session_id", "splice_ms", "timings"} | ({"reused_tokens", "prefilled_tokens"} if radix_hit else set())
    ext = {k: v for k, v in response.leyline.items() if k not in skip}
    return response.choices[0].message.content, response.usage.prompt_tokens, ext


async def test_metadata_carrier_splices_exactly_like_the_field(client, server):
    by_field = await two_turns(client, server, "field")
    by_metadata = await two_turns(client, server, "metadata")
    second = by_metadata[1].leyline
    assert second["session_id"] == by_metadata[0].leyline["session_id"] is not None
    assert second["applied"] and second["fallback"] is None and second["rotated_tokens"] > 0, second
    assert comparable(by_metadata[0], radix_hit=True) == comparable(by_field[0], radix_hit=True)
    assert comparable(by_metadata[1]) == comparable(by_field[1])


async def error_of(client, extra_body) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny-mla", messages=MESSAGES, max_tokens=1, extra_body=extra_body)
    return info.value.body


async def test_carrier_errors_name_the_field(client):
    both = await error_of(client, {"leyline": {}, "metadata": {"leyline": "{}"}})
    assert "sent twice" in both["message"]
    not_json = await error_of(client, {"metadata": {"leyline": "{session"}})
    assert "metadata.leyline: not valid JSON" in not_json["message"]
    not_object = await error_of(client, {"metadata": {"leyline": "[1, 2]"}})
    assert "must be a JSON object" in not_object["message"]
    bad_directive = await error_of(client, {"metadata": {"leyline": '{"directives": [{"start": 3, "end": 1}]}'}})
    assert bad_directive["param"].startswith("leyline.directives.0"), bad_directive
    unknown = await error_of(client, {"metadata": {"leyline": '{"sesion_id": "x"}'}})
    assert unknown["param"] == "leyline.sesion_id", unknown


async def test_metadata_without_the_carrier_is_plain_openai(client):
    reply = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=2, extra_body={"metadata": {"trace": "x"}}
    )
    assert reply.leyline["session_id"] is None  # no session asked for: a plain request


async def test_router_probes_answer_without_a_key(server):
    async with httpx.AsyncClient(base_url=server) as http:
        model = (await http.get("/model_info")).json()
        info = (await http.get("/server_info")).json()
        assert (await http.get("/get_model_info")).json() == model
        models = (await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert model["is_generation"] is True and model["served_model_name"] == models["data"][0]["id"]
    assert model["context_length"] == models["data"][0]["max_model_len"] == info["context_length"]
    assert info["leyline"]["extension_carriers"] == ["leyline", "metadata.leyline"]
    assert info["max_total_num_tokens"] > 0 and "amortize" in info["leyline"]["splice_modes"]
    assert KEY not in json.dumps(info)
