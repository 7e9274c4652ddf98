"""The one decoder: a stream's deltas add up to the whole answer's content, wherever generation stops."""

from __future__ import annotations

import json

import pytest

from leyline_server.api.decoder import TextDecoder

EOS = 2


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def answer(tok, ids, **kw):
    """(streamed text, outcome) for ``ids``, through one decoder."""
    decoder = TextDecoder(tok, [EOS], kw.pop("stops", []), **kw)
    shown = ""
    for token in ids:
        shown += decoder.push(token)
        if decoder.stopped:
            break
    outcome = decoder.outcome("length")
    return shown + decoder.rest(outcome), outcome


def call_tokens(tok) -> list[int]:
    payload = json.dumps({"name": "read_file", "arguments": {"path": "a.py"}})
    return [*encode(tok, "Let me look. "), 3, *encode(tok, payload), 4, *encode(tok, " done"), EOS]


def test_every_cut_of_a_tool_call_gives_the_same_content_streamed(hf_tokenizer):
    ids = call_tokens(hf_tokenizer)
    for n in range(1, len(ids) + 1):  # max_tokens = n
        streamed, outcome = answer(hf_tokenizer, ids[:n], parse_tools=True)
        assert streamed == outcome.content, n
        if n < ids.index(3) + 1:  # no call started yet: plain text
            assert outcome.calls == [] and outcome.content == hf_tokenizer.decode(ids[:n])
        elif n < ids.index(4) + 1:  # the call is cut short: no call, and its framing never reaches the content
            assert outcome.calls == [] and outcome.finish_reason == "length"
            assert outcome.content == "Let me look. "
        else:
            assert [c["function"]["name"] for c in outcome.calls] == ["read_file"]
            after = hf_tokenizer.decode([t for t in ids[ids.index(4) + 1 : n] if t != EOS])
            assert outcome.content == "Let me look. " + after and outcome.finish_reason == "tool_calls"


def test_without_tools_nothing_is_parsed_and_special_tokens_are_skipped(hf_tokenizer):
    ids = call_tokens(hf_tokenizer)
    streamed, outcome = answer(hf_tokenizer, ids, parse_tools=False, skip_special=True)
    assert outcome.calls == [] and "tool_calls" not in outcome.message
    assert "<tool_call>" not in outcome.content and '"name": "read_file"' in outcome.content
    assert streamed == outcome.content
    streamed, outcome = answer(hf_tokenizer, ids, parse_tools=False, skip_special=False)
    assert outcome.content.startswith("Let me look. <tool_call>") and streamed == outcome.content


@pytest.mark.parametrize("keep_stop", [False, True])
def test_stop_strings_are_cut_or_kept_the_same_way_streamed(hf_tokenizer, keep_stop):
    ids = encode(hf_tokenizer, "alpha beta STOP gamma delta")
    for n in range(1, len(ids) + 1):
        streamed, outcome = answer(hf_tokenizer, ids[:n], stops=["STOP"], keep_stop=keep_stop)
        assert streamed == outcome.content
        assert "gamma" not in outcome.content
    assert outcome.content == ("alpha beta STOP" if keep_stop else "alpha beta ")
    assert outcome.finish_reason == "stop"


def test_only_the_first_call_without_parallel_calls(hf_tokenizer):
    one = [3, *encode(hf_tokenizer, json.dumps({"name": "a", "arguments": {}})), 4]
    two = [3, *encode(hf_tokenizer, json.dumps({"name": "b", "arguments": {}})), 4]
    _, outcome = answer(hf_tokenizer, one + two, parse_tools=True, parallel=False)
    assert [c["function"]["name"] for c in outcome.calls] == ["a"] and outcome.message["content"] is None
    _, outcome = answer(hf_tokenizer, one + two, parse_tools=True)
    assert [c["function"]["name"] for c in outcome.calls] == ["a", "b"]


def test_a_second_call_cut_short_leaves_no_framing_in_the_content(hf_tokenizer):
    first = call_tokens(hf_tokenizer)[:-3]  # "Let me look. " + one whole call
    second = [3, *encode(hf_tokenizer, '{"name": "read_fi')]  # a second call, cut by the length limit
    streamed, outcome = answer(hf_tokenizer, first + second, parse_tools=True)
    assert [c["function"]["name"] for c in outcome.calls] == ["read_file"]
    assert outcome.content == streamed == "Let me look. " and "<tool_call>" not in outcome.content
