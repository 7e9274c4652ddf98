"""Requests shaped the way clients and SGLang's router send them, through the real ``openai`` client.

Oracles: the same request with the fields left out (``null`` must mean "unset"), OpenAI's own
``models.retrieve`` and its error classes, and SGLang's router itself in front of the server
(it rewrites every chat request into SGLang's request type before forwarding it).
"""

from __future__ import annotations

import httpx
import openai
import pytest

from examples.cluster import router
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
ASK = [{"role": "user", "content": "Say something."}]
# every chat field OpenAI documents as nullable (openai-python's CompletionCreateParams)
NULLABLE = [
    "temperature",
    "top_p",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "logit_bias",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "user",
    "metadata",
    "store",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
]
# what SGLang's router (sglang-router 0.3.2) writes into every chat request it forwards
ROUTER_DEFAULTS = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
    "logprobs": False,
}


@pytest.fixture(scope="module")
def server():
    with running_server(make_service()) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


async def answer(server, **fields):
    async with httpx.AsyncClient(base_url=server, timeout=60) as c:
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 8, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


async def test_null_means_unset(server):
    greedy = await answer(server, temperature=0)
    nulls = {name: None for name in NULLABLE if name not in ("max_tokens", "temperature")}
    assert await answer(server, temperature=0, **nulls) == greedy
    # a null temperature is OpenAI's default (1), not greedy: the same draw as an explicit 1
    sampled = await answer(server, temperature=1, seed=7)
    assert await answer(server, temperature=None, seed=7, top_p=None) == sampled


async def test_the_routers_field_set_is_accepted_and_changes_nothing(server):
    greedy = await answer(server, temperature=0)
    assert await answer(server, temperature=0, **ROUTER_DEFAULTS) == greedy


async def test_models_retrieve(client):
    listed = (await client.models.list()).data
    assert [m.id for m in listed] == [MODEL]
    model = await client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model" and model == listed[0]
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("gpt-4o")
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
    ],
)
async def test_content_parts_other_than_text_are_refused_by_name(client, part):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert caught.value.param == "messages.0.content.1.type"
    assert repr(part["type"]) in caught.value.message


async def test_text_parts_are_joined_as_before(server):
    whole = await answer(server, temperature=0)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "something."}]}]
    async with httpx.AsyncClient(base_url=server, timeout=60) as c:
        r = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": parts, "max_tokens": 8, "temperature": 0}
        )
    assert r.json()["choices"][0] == whole


def test_through_sglangs_router(server):
    """SGLang's router in front of the server: its rewritten requests are answered like direct ones."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8, "temperature": 0}
    with router([server], MODEL, "round_robin") as url:
        routed = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    direct = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert routed.status_code == 200, routed.text
    assert routed.json()["choices"][0] == direct.json()["choices"][0]


async def test_continue_final_message_appends_the_message_to_the_generation_prompt(server):
    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

    started = [*ASK, {"role": "assistant", "content": "Well, the"}]
    async with httpx.AsyncClient(base_url=server, timeout=60) as c:
        head = await c.post("/v1/leyline/tokenize", json={"messages": ASK, "add_generation_prompt": True})
        body = {"model": MODEL, "messages": started, "max_tokens": 4, "temperature": 0}
        r = await c.post("/v1/chat/completions", json={**body, "continue_final_message": True})
        assert r.status_code == 200, r.text
        tail = load_tiny_tokenizer()("Well, the", add_special_tokens=False)["input_ids"]
        assert r.json()["usage"]["prompt_tokens"] == len(head.json()["tokens"]) + len(tail)
        lone = await c.post("/v1/chat/completions", json={**body, "messages": ASK, "continue_final_message": True})
        assert lone.status_code == 400 and lone.json()["error"]["param"] == "continue_final_message"
        unread = await c.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"nowhere": 1}})
        assert unread.status_code == 400 and unread.json()["error"]["param"] == "chat_template_kwargs.nowhere"
