"""The pure conversions of the Responses and Messages adapters, against hand-written oracles:
items and blocks to chat messages (and back), reasoning sealed and read back, tools, tool choice,
and Anthropic's context edits computed by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from leyline_sdk.core.responses_items import ItemError, chat_tools, output_items, seal, to_items, to_messages, unseal
from leyline_server.api.errors import APIError
from leyline_server.api.messages_api import blocks
from leyline_server.api.messages_api.context_edits import PLACEHOLDER, apply_context_edits

CALL = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Read it."},
    {"role": "assistant", "content": "Reading.", "tool_calls": [CALL], "reasoning_content": "I should read."},
    {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
    {"role": "assistant", "content": "Done."},
]


# -- Responses items -------------------------------------------------------------------------------
def test_items_and_chat_messages_round_trip():
    assert to_messages(None, [], to_items(CHAT)) == CHAT


def test_typed_and_easy_messages_developer_and_parts():
    items = [{"role": "developer", "content": "Rules."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                              {"type": "input_text", "text": "b"}]}]  # fmt: skip
    assert to_messages("Top.", [], items) == [{"role": "system", "content": "Top."},
                                              {"role": "system", "content": "Rules."},
                                              {"role": "user", "content": "a\nb"}]  # fmt: skip


def test_reasoning_the_server_sealed_is_read_back_and_anothers_dropped():
    ours = [{"type": "reasoning", "encrypted_content": seal("think")}, {"role": "assistant", "content": "A"}]
    theirs = [{"type": "reasoning", "encrypted_content": "gAAAA-opaque"}, {"role": "assistant", "content": "A"}]
    assert to_messages(None, [], ours) == [{"role": "assistant", "content": "A", "reasoning_content": "think"}]
    assert to_messages(None, [], theirs) == [{"role": "assistant", "content": "A"}]
    assert unseal(seal("héllo")) == "héllo" and unseal("leyline.v1:!!") is None


def test_output_items_seal_reasoning_when_asked_and_split_namespaces():
    message = {"role": "assistant", "content": "Hi", "reasoning_content": "r",
               "tool_calls": [{"id": "c", "function": {"name": "fs.read", "arguments": "{}"}}]}  # fmt: skip
    items = output_items(message, "r", True)
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert unseal(items[0]["encrypted_content"]) == "r"
    assert items[2]["namespace"] == "fs" and items[2]["name"] == "read"
    assert "encrypted_content" not in output_items(message, "r", False)[0]
    assert to_messages(None, [], items)[0]["tool_calls"][0]["function"]["name"] == "fs.read"  # read back whole


def test_item_references_resolve_for_the_key_and_are_404_otherwise():
    stored = {"msg_1": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]}}
    assert to_messages(None, [], [{"type": "item_reference", "id": "msg_1"}], stored.get) == [
        {"role": "assistant", "content": "Hi"}
    ]
    with pytest.raises(ItemError) as caught:
        to_messages(None, [], [{"type": "item_reference", "id": "msg_2"}], stored.get)
    assert caught.value.status == 404


@pytest.mark.parametrize(
    ("item", "param"),
    [({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, "input.0.content.0.type"),
     ({"type": "web_search_call", "id": "ws"}, "input.0.type"), ({"role": "tool", "content": "x"}, "input.0.role")],
)  # fmt: skip
def test_what_the_model_cannot_take_is_refused_by_name(item, param):
    with pytest.raises(ItemError) as caught:
        to_messages(None, [], [item])
    assert caught.value.param == param


def test_function_namespace_and_hosted_tools():
    tools = [{"type": "function", "name": "read", "parameters": {"type": "object"}, "strict": True},
             {"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "ls"}]},
             {"type": "web_search", "external_web_access": False}]  # fmt: skip
    chat, not_offered = chat_tools(tools)
    assert [t["function"]["name"] for t in chat] == ["read", "fs.ls"] and chat[0]["function"]["strict"] is True
    assert not_offered == ["web_search"]


# -- Messages blocks -------------------------------------------------------------------------------
def test_blocks_become_the_chat_conversation():
    messages = [
        {"role": "system", "content": "Inner."},
        {"role": "user", "content": "Read it."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "I should read.", "signature": "s"},
                                          {"type": "text", "text": "Reading."},
                                          {"type": "tool_use", "id": "call_1", "name": "read", "input": {"p": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "is_error": True,
                                      "content": [{"type": "text", "text": "x = 1"}]},
                                     {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}]},
    ]  # fmt: skip
    system = [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}]
    assert blocks.to_chat_messages(system, messages) == [
        {"role": "system", "content": "A.\n\nB."},
        {"role": "system", "content": "Inner."},
        {"role": "user", "content": "Read it."},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "I should read.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "[error] x = 1"},
        {"role": "user", "content": "Go on."},
    ]  # fmt: skip


def test_the_answers_thinking_is_read_back_from_its_redacted_form():
    out = blocks.answer_blocks({"role": "assistant", "content": "Hi", "reasoning_content": "r", "tool_calls": [CALL]})
    assert [b["type"] for b in out] == ["thinking", "text", "tool_use"] and out[2]["input"] == {"p": 1}
    redacted = [{"type": "redacted_thinking", "data": out[0]["signature"]}, {"type": "text", "text": "Hi"}]
    foreign = [{"type": "redacted_thinking", "data": "EmwKAhgBEgy..."}, {"type": "text", "text": "Hi"}]
    assert blocks.to_chat_messages(None, [{"role": "assistant", "content": redacted}])[0]["reasoning_content"] == "r"
    assert "reasoning_content" not in blocks.to_chat_messages(None, [{"role": "assistant", "content": foreign}])[0]


@pytest.mark.parametrize("kind", ["image", "document", "search_result"])
def test_media_blocks_are_a_400_naming_the_block(kind):
    with pytest.raises(APIError) as caught:
        blocks.to_chat_messages(None, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": kind}]}])
    assert caught.value.status == 400 and caught.value.param == "messages.0.content.1.type"


def test_tools_and_tool_choice():
    tools, not_offered = blocks.chat_tools([{"name": "read", "input_schema": {"type": "object"}},
                                            {"type": "web_search_20250305", "name": "web_search"}])  # fmt: skip
    assert tools == [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    assert not_offered == ["web_search"]
    assert blocks.chat_tool_choice({"type": "any", "disable_parallel_tool_use": True}, True) == ("required", False)
    assert blocks.chat_tool_choice({"type": "tool", "name": "read"}, True)[0] == {
        "type": "function", "function": {"name": "read"}}  # fmt: skip
    assert blocks.chat_tool_choice({"type": "none"}, True) == ("none", None)
    assert blocks.stop_reason("stop", "END") == ("stop_sequence", "END")
    assert blocks.stop_reason("length", None) == ("max_tokens", None)


# -- context edits, against a hand computation ------------------------------------------------------
def loop(uses: int, reasoning: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(uses):
        fn = {"name": "ls" if i == 0 else "read", "arguments": json.dumps({"path": f"f{i}"})}
        call = {"id": f"c{i}", "type": "function", "function": fn}
        assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        if reasoning:
            assistant["reasoning_content"] = f"think {i}"
        out += [assistant, {"role": "tool", "tool_call_id": f"c{i}", "content": "word " * 50}]
    return out


def words(text: str) -> int:
    return len(text.split())


def clear(**edit: Any) -> dict[str, Any]:
    return {"edits": [{"type": "clear_tool_uses_20250919", **edit}]}


def test_clear_tool_uses_keeps_the_latest_and_counts_what_it_cleared():
    edits = apply_context_edits(loop(5), clear(trigger={"type": "tool_uses", "value": 3}), 0, words)
    results = [m["content"] for m in edits.messages if m["role"] == "tool"]
    assert results[:2] == [PLACEHOLDER] * 2 and all(r != PLACEHOLDER for r in results[2:])  # keep: 3
    per = words("word " * 50) - words(PLACEHOLDER)
    assert edits.applied == [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 2 * per}
    ]
    assert loop(5)[2]["content"] != PLACEHOLDER  # the caller's history is not touched


def test_trigger_clear_at_least_exclude_tools_and_inputs():
    assert apply_context_edits(loop(5), clear(), 99_999, words).applied == []  # default trigger: 100,000 tokens
    assert apply_context_edits(loop(5), clear(), 100_000, words).applied[0]["cleared_tool_uses"] == 2
    least = clear(trigger={"type": "tool_uses", "value": 1}, clear_at_least={"type": "input_tokens", "value": 10**6})
    assert apply_context_edits(loop(5), least, 0, words).applied == []
    spared = apply_context_edits(
        loop(5), clear(trigger={"type": "tool_uses", "value": 1}, exclude_tools=["ls"]), 0, words
    )
    assert spared.messages[2]["content"] != PLACEHOLDER and spared.messages[4]["content"] == PLACEHOLDER
    inputs = apply_context_edits(loop(5), clear(trigger={"type": "tool_uses", "value": 1}, clear_tool_inputs=["read"]),
                                 0, words)  # fmt: skip
    arguments = [m["tool_calls"][0]["function"]["arguments"] for m in inputs.messages if m.get("tool_calls")]
    assert arguments[0] == '{"path": "f0"}' and arguments[1] == "{}" and arguments[2] == '{"path": "f2"}'


def test_clear_thinking_keeps_the_latest_turns():
    edit = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}]}
    edits = apply_context_edits(loop(4, reasoning=True), edit, 0, words)
    kept = [m.get("reasoning_content") for m in edits.messages if m["role"] == "assistant"]
    assert kept == [None, None, "think 2", "think 3"]
    assert edits.applied == [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 4}
    ]
    keep_all = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert apply_context_edits(loop(4, reasoning=True), keep_all, 0, words).applied == []
    with pytest.raises(APIError):
        apply_context_edits(loop(1), {"edits": [{"type": "compact_20260112"}]}, 0, words)
