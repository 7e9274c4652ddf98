"""Tool calls parsed from generated text in the template's format."""

from __future__ import annotations

import json

from leyline_server.api.toolcalls import parse_tool_calls


def test_well_formed_calls_are_extracted():
    text = (
        'Let me look.<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
        '<tool_call>{"name": "run", "arguments": "{\\"cmd\\": \\"ls\\"}"}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["read_file", "run"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a.py"}
    assert calls[1]["function"]["arguments"] == '{"cmd": "ls"}'
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_malformed_calls_stay_in_the_content():
    for text in (
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call>[1]</tool_call>",
    ):
        content, calls = parse_tool_calls(text)
        assert content == text and calls == []
