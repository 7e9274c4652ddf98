"""Streaming on the llama.cpp engine's thread: decoding runs ahead, only delivered tokens are committed.

The oracle is a fresh engine: after a stream closed early, the session's next turn must see
exactly the tokens the client received (logits equal to a prefill of them from nothing), and the
sequence must hold no KV for tokens decoded ahead but never delivered.
"""

from __future__ import annotations

import numpy as np

from leyline_server.contract.values import SamplingParams
from leyline_server.engines.llamacpp.serving import AsyncLlamaCppEngine
from tests.llamacpp.helpers import BASE, SCOPE, engine, fresh_logits, max_diff

PROMPT = BASE[:48]


def _tracking(core):
    """Record the longest a decoding sequence ever got (proof that decoding ran ahead)."""
    longest = [0]
    forward = core.forward

    def tracked(chunks, decodes):
        out = forward(chunks, decodes)
        longest[0] = max([longest[0], *(job.entry.cached for job in decodes)])
        return out

    core.forward = tracked
    return longest


async def test_a_stream_closed_early_commits_only_what_the_client_received(tiny1):
    core = engine(tiny1)
    front = AsyncLlamaCppEngine(core)
    longest = _tracking(core)
    turn = await front.start_turn(PROMPT, SCOPE, None, None)
    stream = front.stream(turn, SamplingParams(max_tokens=40))
    got = [(await anext(stream)).token for _ in range(3)]
    for _ in range(200):  # let the worker run ahead of this (now idle) consumer
        if longest[0] > len(PROMPT) + 3:
            break
        await front.scheduler.call(lambda: None)
    await stream.aclose()
    assert longest[0] > len(PROMPT) + 3, "the worker never decoded ahead: the trim path went untested"
    handle = turn.handle
    assert handle.tokens == PROMPT + got and turn.generated == got
    await front.scheduler.call(core.check, handle)  # the sequence ends where the handle says
    assert handle.cached == len(handle.tokens)  # KV for every delivered token, nothing past it

    follow = handle.tokens + [5, 6, 7]
    nxt = await front.start_turn(follow, SCOPE, handle, None)
    assert nxt.reused == len(PROMPT) + 3  # the session's sequence was reused up to the end
    assert max_diff(np.asarray(nxt.last_logits), fresh_logits(tiny1, follow)) < 1e-4
    front.release(nxt.handle)
    await front.close()


async def test_a_finished_stream_commits_every_token_and_matches_the_sync_core(tiny1):
    sync = engine(tiny1)
    result = sync.prefill(PROMPT, SCOPE)
    expected = [s.token for s in sync.decode(result.handle, result.last_logits, SamplingParams(max_tokens=12))]
    sync.close()

    core = engine(tiny1)
    front = AsyncLlamaCppEngine(core)
    turn = await front.start_turn(PROMPT, SCOPE, None, None)
    steps = [s async for s in front.stream(turn, SamplingParams(max_tokens=12))]
    assert [s.token for s in steps] == expected and steps[-1].finish_reason == "length"
    assert turn.handle.tokens == PROMPT + expected
    assert turn.handle.cached == len(turn.handle.tokens) - 1  # the last token has no KV yet
    await front.scheduler.call(core.check, turn.handle)
    front.release(turn.handle)
    await front.close()
