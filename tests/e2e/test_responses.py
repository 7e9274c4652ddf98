"""``/v1/responses`` with openai's own client, plain and ``AsyncLeyline``: create, stream, retrieve,
delete, input_items, ``previous_response_id`` chains, keys kept apart.

The oracles: openai-python parses every answer into its own types (``Response``, the stream's
event union), and the Responses API's answer must be the chat turn's answer — the same greedy
text and the same prompt tokens as ``chat.completions`` on the same conversation, which the
Responses adapter only translates. A continued conversation must be a cache hit (its
``cached_tokens`` cover the previous prompt and answer).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
KEYS = ("sk-resp-a", "sk-resp-b")
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    service = make_service(MODEL, kv_budget_mb=64, api_keys=frozenset(KEYS))
    with running_server(service) as url:
        yield url + "/v1"


def clients(server: str, key: str = KEYS[0]) -> list[openai.AsyncOpenAI]:
    return [openai.AsyncOpenAI(base_url=server, api_key=key), AsyncLeyline(base_url=server, api_key=key)]


@pytest.fixture(params=["plain", "leyline"])
async def client(request, server) -> AsyncIterator[openai.AsyncOpenAI]:
    plain, leyline = clients(server)
    await (leyline if request.param == "plain" else plain).close()
    yield plain if request.param == "plain" else leyline
    await (plain if request.param == "plain" else leyline).close()


async def chat_answer(server: str, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The chat turn's own greedy answer and prompt tokens (the oracle)."""
    async with openai.AsyncOpenAI(base_url=server, api_key=KEYS[1]) as plain:
        out = await plain.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=6)
    assert out.usage is not None
    return out.choices[0].message.content or "", out.usage.prompt_tokens


async def test_create_answers_as_the_chat_turn_does(client, server):
    response = await client.responses.create(model=MODEL, input="Say hi.", instructions="Be brief.", **GREEDY)
    assert isinstance(response, Response) and response.status in ("completed", "incomplete")
    text, prompt = await chat_answer(server, [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Say hi."}])  # fmt: skip
    assert response.output_text == text
    assert response.usage is not None and response.usage.input_tokens == prompt
    assert response.instructions == "Be brief."


async def test_stream_events_in_order_and_the_same_answer(client, server):
    async with client.responses.stream(model=MODEL, input="Count to three.", **GREEDY) as stream:
        events = [event async for event in stream]
    final = events[-1].response  # type: ignore[union-attr]  # (get_final_response wants response.completed)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.done" in kinds
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    text, _ = await chat_answer(server, [{"role": "user", "content": "Count to three."}])
    assert deltas == final.output_text == text


async def test_retrieve_input_items_and_delete(client):
    two = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    created = await client.responses.create(model=MODEL, input=two, **GREEDY)
    fetched = await client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    items = await client.responses.input_items.list(created.id, order="asc")
    assert [i.content[0].text for i in items.data] == ["one", "two"]  # type: ignore[union-attr]
    deleted = await client.responses.delete(created.id)
    assert deleted is None  # openai's delete returns nothing on success
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


async def test_previous_response_id_chains_are_cache_hits(client, server):
    # instructions are not carried over from a previous response (OpenAI's rule): each turn sends them
    kw = {"instructions": "Short.", **GREEDY}
    first = await client.responses.create(model=MODEL, input="Name a colour.", **kw)
    second = await client.responses.create(model=MODEL, input="Another.", previous_response_id=first.id, **kw)
    third = await client.responses.create(model=MODEL, input="One more.", previous_response_id=second.id, **kw)
    for before, after in ((first, second), (second, third)):
        assert before.usage is not None and after.usage is not None
        cached = after.usage.input_tokens_details.cached_tokens
        assert cached >= before.usage.input_tokens, (before.usage, after.usage)  # the previous prompt: a hit
    conversation = [{"role": "system", "content": "Short."},
                    {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "Another."}, {"role": "assistant", "content": second.output_text},
                    {"role": "user", "content": "One more."}]  # fmt: skip
    text, prompt = await chat_answer(server, conversation)
    assert third.output_text == text and third.usage.input_tokens == prompt


async def test_a_missing_previous_response_is_the_responses_apis_error(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope", **GREEDY)
    assert caught.value.code == "previous_response_not_found"


async def test_a_stored_response_of_another_key_is_a_404(server):
    for owner, other in zip(clients(server, KEYS[0]), clients(server, KEYS[1]), strict=True):
        created = await owner.responses.create(model=MODEL, input="mine", **GREEDY)
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.input_items.list(created.id)
        with pytest.raises(openai.BadRequestError):
            await other.responses.create(model=MODEL, input="x", previous_response_id=created.id, **GREEDY)
        assert (await owner.responses.retrieve(created.id)).id == created.id
        await owner.close()
        await other.close()


def tool_history(calls: int) -> list[dict[str, Any]]:
    """An agent's items: a question, then ``calls`` function calls with long outputs."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find value_7."}]
    for i in range(calls):
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "read", "arguments": "{}"})
        output = "".join(f"value_{i}_{k} = {k * k}\n" for k in range(40))
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": output})
    return items


READ = {"type": "function", "name": "read", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {}}}  # fmt: skip


async def test_the_sdks_policies_edit_the_items_and_splice(server):
    client = AsyncLeyline(base_url=server, api_key=KEYS[0], policies=[TruncateOlderThanN(2)])
    items = tool_history(3)
    for turn in range(3):
        items = [*items, {"role": "user", "content": f"And file {turn}?"}]
        if turn % 2:
            async with client.responses.stream(model=MODEL, input=items, tools=[READ], **GREEDY) as stream:
                response = [event async for event in stream][-1].response  # type: ignore[union-attr]
        else:
            response = await client.responses.create(model=MODEL, input=items, tools=[READ], **GREEDY)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        call = {"type": "function_call", "call_id": f"next_{turn}", "name": "read", "arguments": "{}"}
        items += [call, {"type": "function_call_output", "call_id": f"next_{turn}", "output": "x = 1\n" * 40}]
    (session,) = client.sessions
    stats = session.stats
    assert len(stats) == 3 and all(s.fallback is None for s in stats), stats
    assert all(s.rotated_tokens > 0 and s.directives > 0 for s in stats[1:]), stats
    assert all(s.cached_tokens > 0 for s in stats[1:])
    outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
    assert all(len(o) > 200 for o in outputs)  # the caller's items: whole; only the model's view is stubbed
    await client.close()
