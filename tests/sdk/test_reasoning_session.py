"""A LeylineSession on a reasoning template, against the strict fake server (its own full render is the oracle).

The fake "model" generates exactly the answer the agent then records (reasoning included), so
the only differences between the base and the next prompt are the template's and the policies'.
"""

from __future__ import annotations

import pytest

from benchmarks.traces import TOOLS, messages_at, reasoning_agent_trace
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Mode
from tests.sdk.fake_server import FakeLeyline
from tests.sdk.reasoning_templates import answer_text, make_chat


@pytest.mark.parametrize("local", [True, False], ids=["local-tokenizer", "server-tokenize"])
@pytest.mark.parametrize("in_field", [False, True], ids=["think-in-content", "reasoning_content"])
@pytest.mark.parametrize("truncate", [False, True], ids=["no-policy", "truncate-2"])
async def test_a_new_query_reprefills_only_itself(local, in_field, truncate):
    chat = make_chat("strip")
    fake = FakeLeyline(chat)
    policies = [TruncateOlderThanN(2)] if truncate else []
    client = AsyncLeyline(
        base_url="http://fake/v1",
        http_client=fake.client(),
        max_retries=0,
        policies=policies,
        tokenizer=chat if local else None,
    )
    session = client.session(tools=TOOLS)
    steps = reasoning_agent_trace(turns=15, reasoning_in_field=in_field)
    for t, step in enumerate(steps):
        messages = messages_at(steps, t)
        fake.completion = answer_text(chat, messages, step.answer, TOOLS)  # the model says what the agent records
        await session.create(model="m", messages=messages)
        seen, stats = fake.chats[-1], session.stats[-1]
        assert stats.fallback is None and seen.fallback is None, (t, stats)
        if t == 0:
            continue
        assert seen.spliced is not None and seen.prompt[: len(seen.spliced)] == seen.spliced  # the oracle
        if step.kind == "query":  # every reasoning block of the last query dropped, in place
            directives = session.last_directives
            stubs = sum(len(d.replacement) for d, s in zip(directives, stats.sources, strict=True) if s == "policy")
            assert stats.template_directives == 5 and all(d.mode is Mode.AMORTIZE for d in directives)
            # prefilled: the new query and the generation prompt (plus the policy's new stubs)
            assert stats.prefilled_tokens - stubs <= 0.05 * stats.prompt_tokens, stats
        assert stats.policy_directives == stats.cleared
    assert sum(s.rotated_tokens for s in session.stats) > 0
    if truncate:
        assert sum(s.policy_directives for s in session.stats) >= 5
    await client.aclose()


async def test_sync_edits_on_an_unstable_template_leave_it_to_the_next_request():
    chat = make_chat("strip")
    fake = FakeLeyline(chat)
    client = AsyncLeyline(
        base_url="http://fake/v1",
        http_client=fake.client(),
        max_retries=0,
        policies=[TruncateOlderThanN(1)],
        tokenizer=chat,
    )
    session = client.session(tools=TOOLS)
    steps = reasoning_agent_trace(turns=9)
    for t in range(8):
        fake.completion = answer_text(chat, messages_at(steps, t), steps[t].answer, TOOLS)
        await session.create(model="m", messages=messages_at(steps, t))
    session.history = messages_at(steps, 8)  # the agent appended its turn; the tool still runs
    assert session.server.seen_render is not None and not session.server.seen_render.prefix_stable
    assert await session.sync_edits() is None  # no forget from the first stripped block
    assert not any(path.endswith("/directives") for _, path in fake.requests)
    await session.create(model="m", messages=messages_at(steps, 8))
    stats = session.stats[-1]
    assert stats.fallback is None and stats.policy_directives >= 1 and fake.chats[-1].spliced is not None
    output = len(chat.encode(messages_at(steps, 8)[-1]["content"])[0])  # the new tool output
    assert stats.rotated_tokens > 0 and stats.prefilled_tokens < output + 60  # + the stub and the headers
    await client.aclose()
