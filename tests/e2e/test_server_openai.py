"""The real server on a loopback port, driven by the real ``openai.AsyncOpenAI`` client."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from leyline_sdk.core.directives import Directive, apply, digest
from tests.e2e.server_helpers import make_service, running_server

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the file."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def main():\n    return 1\n" * 20},
    {"role": "user", "content": "Now fix it."},
]
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def server():
    with running_server(make_service()) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


async def tokenize(server, messages, tools=None, generation=True):
    async with httpx.AsyncClient(base_url=server) as http:
        r = await http.post(
            "/v1/leyline/tokenize", json={"messages": messages, "tools": tools, "add_generation_prompt": generation}
        )
        r.raise_for_status()
        return r.json()


async def test_plain_openai_request_and_radix_reuse(client):
    first = await client.chat.completions.create(model="tiny-mla", messages=MESSAGES, tools=TOOLS, max_tokens=4)
    assert isinstance(first, ChatCompletion)
    assert first.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    assert first.usage.completion_tokens == len(first.leyline["completion_token_ids"]) <= 4
    again = await client.chat.completions.create(model="tiny-mla", messages=MESSAGES, tools=TOOLS, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # all but the last
    assert again.leyline["session_id"] is None  # plain clients get no session


async def test_splice_through_extra_body_matches_apply(client, server):
    first = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, tools=TOOLS, max_tokens=3, extra_body={"leyline": {}}
    )
    ext = first.leyline
    sid = ext["session_id"]
    prompt = (await tokenize(server, MESSAGES, TOOLS))["tokens"]
    base = prompt + ext["completion_token_ids"]
    assert ext["base"] == {"length": len(base), "digest": digest(base)}

    # evict the tool output: the SDK would compute this directive from the message diff
    edited = [dict(m) for m in MESSAGES]
    edited[3]["content"] = "[evicted: read_file(a.py), 40 lines]"
    old_r = await tokenize(server, MESSAGES, TOOLS)
    new_r = await tokenize(server, edited, TOOLS)
    span = old_r["message_spans"][3]
    new_span = new_r["message_spans"][3]
    directive = Directive(
        start=span["start"], end=span["end"], replacement=new_r["tokens"][new_span["start"] : new_span["end"]]
    )
    follow_up = edited + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "continue"}]
    prompt2 = (await tokenize(server, follow_up, TOOLS))["tokens"]
    # The generated tokens differ from the re-rendered assistant message: replace that tail too
    # (what the SDK does when its check of the generated part fails).
    spliced = apply(base, [directive])
    c = next(i for i, (a, b) in enumerate(zip(spliced, prompt2, strict=False)) if a != b)
    tail = Directive(start=c - directive.delta, end=len(base), replacement=prompt2[c:])
    directives = [directive, tail]
    assert apply(base, directives) == prompt2
    second = await client.chat.completions.create(
        model="tiny-mla",
        messages=follow_up,
        tools=TOOLS,
        max_tokens=3,
        extra_body={
            "leyline": {
                "session_id": sid,
                "base": ext["base"],
                "directives": [d.model_dump(mode="json") for d in directives],
            }
        },
    )
    s = second.leyline
    assert s["session_id"] == sid and s["applied"] and s["fallback"] is None, s
    assert s["rotated_tokens"] == tail.start - span["end"]  # the downstream between the two edits
    assert s["reused_tokens"] == directive.start
    assert second.usage.prompt_tokens == len(prompt2)
    assert second.usage.prompt_tokens_details.cached_tokens == s["reused_tokens"] + s["rotated_tokens"]
    assert s["prefilled_tokens"] == len(prompt2) - s["reused_tokens"] - s["rotated_tokens"]
    async with httpx.AsyncClient(base_url=server) as http:
        state = (await http.get(f"/v1/leyline/sessions/{sid}")).json()
    assert state["tokens"] == prompt2 + s["completion_token_ids"]
    assert s["base"] == {"length": len(state["tokens"]), "digest": digest(state["tokens"])}


async def test_streaming_chunks_parse_and_match_the_final_stats(client):
    stream = await client.chat.completions.create(
        model="tiny-mla",
        messages=MESSAGES,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"leyline": {}},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    ext = finals[0].leyline
    assert usage.completion_tokens == len(ext["completion_token_ids"])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text


async def test_strict_unknown_session_is_404_and_fallback_otherwise(client):
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(
            model="tiny-mla",
            messages=MESSAGES,
            max_tokens=1,
            extra_body={"leyline": {"session_id": "nope", "strict": True}},
        )
    assert info.value.body["code"] == "session_not_found"
    r = await client.chat.completions.create(
        model="tiny-mla",
        messages=MESSAGES,
        max_tokens=1,
        extra_body={"leyline": {"session_id": "nope", "directives": [{"start": 0, "end": 1, "replacement": [5]}]}},
    )
    assert r.leyline["fallback"]["code"] == "base_mismatch" and not r.leyline["applied"]
    assert r.leyline["session_id"] not in (None, "nope")  # a fresh session continues the conversation


async def test_logprobs_in_openai_shapes_streamed_and_not(client):
    r = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    ids = r.leyline["completion_token_ids"]
    assert len(content) == len(ids) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-9  # greedy: the best one was chosen
        assert entry.top_logprobs[0].token == entry.token
    stream = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [e for chunk in [c async for c in stream] if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]  # fmt: skip
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [round(e.logprob, 6) for e in streamed] == [round(e.logprob, 6) for e in content]


async def test_logit_bias_and_penalties_change_the_output_as_asked(client):
    plain = await client.chat.completions.create(model="tiny-mla", messages=MESSAGES, max_tokens=4, temperature=0)
    first = plain.leyline["completion_token_ids"][0]
    banned = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=4, temperature=0, logit_bias={str(first): -100}
    )
    assert banned.leyline["completion_token_ids"][0] != first
    forced = await client.chat.completions.create(
        model="tiny-mla", messages=MESSAGES, max_tokens=6, temperature=0, logit_bias={"97": 100}
    )
    assert set(forced.leyline["completion_token_ids"]) == {97}
    leaning = {"model": "tiny-mla", "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "logit_bias": {"97": 12}}
    without = await client.chat.completions.create(**leaning)
    penalised = await client.chat.completions.create(**leaning, frequency_penalty=2.0, presence_penalty=1.0)
    assert without.leyline["completion_token_ids"].count(97) == 8
    assert 0 < penalised.leyline["completion_token_ids"].count(97) < 8  # each repeat costs more
