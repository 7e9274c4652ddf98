"""Tool calls as models write them: tagged, fenced and bare calls parsed; everything else left as text."""

from __future__ import annotations

import json

import pytest

from leyline_server.api.callscan import CallScan, hold_of
from leyline_server.api.toolcalls import parse_tool_calls, unfinished_call_at

NAMES = {"read_file", "get_weather"}
READ = {"name": "read_file", "arguments": {"path": "calc.py"}}


def calls_of(text: str, names=NAMES) -> tuple[str, list[tuple[str, object]]]:
    content, calls = parse_tool_calls(text, names)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(
    "text",
    [
        # what Qwen2.5-Coder 0.5B and 1.5B wrote when asked through each protocol (docs/results/tool_calls.md)
        '```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "calc.py"\n  }\n}\n```',
        '{"name": "read_file", "arguments": {"path": "calc.py"}}',
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>',
        '```\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n```',
        '```tool_call\n{"name": "read_file", "parameters": {"path": "calc.py"}}\n```',
        '```json\n[{"name": "read_file", "arguments": {"path": "calc.py"}}]\n```',
        '  \n{"name": "read_file", "arguments": "{\\"path\\": \\"calc.py\\"}"}\n',
        # Qwen2.5-Coder 1.5B through Codex: the template's tool-list tag around a call
        '<tools>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tools>',
    ],
)
def test_each_form_is_one_call_and_leaves_no_framing(text):
    content, calls = calls_of(text)
    assert calls == [("read_file", {"path": "calc.py"})]
    assert content.strip() == ""


def test_text_around_a_fenced_call_stays_in_order():
    text = 'Let me read it.\n```json\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n```\nThen I answer.'
    content, calls = calls_of(text)
    assert content == "Let me read it.\n\nThen I answer." and calls == [("read_file", {"path": "calc.py"})]


def test_several_calls_in_several_forms_come_back_in_the_order_written():
    text = (
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '{"name": "read_file", "arguments": {"path": "a"}} and '
        '```json\n{"name": "read_file", "arguments": {"path": "b"}}\n``` or '
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    content, calls = calls_of(text)
    assert [c[1] for c in calls] == [{"city": "Oslo"}, {"path": "a"}, {"path": "b"}, {"city": "Rome"}]
    assert content == "\n and  or "


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"name": "calc.py", "arguments": {}}\n```',  # a tool nobody offered: the 0.5B's mistake
        '{"name": "Ada", "age": 36}',  # a JSON answer with a name field
        '```python\nprint({"name": "read_file", "arguments": {}})\n```',  # code that mentions a call
        '```json\n{"name": "read_file", "arguments": [1]}\n```',  # arguments that are not an object
        'The call would be {"name": "read_file", "arguments": {}} in a sentence.',  # not at the start
        '<tools>\n{"name": "run", "arguments": {}}\n</tools>',  # a tool list echoed, or another tool
        "<tools>read_file, get_weather</tools>",  # the tag around text
    ],
)
def test_what_is_not_a_call_to_an_offered_tool_stays_text(text):
    content, calls = calls_of(text)
    assert calls == [] and content == text


def test_tagged_calls_count_whatever_their_name():
    _, calls = calls_of('<tool_call>{"name": "other", "arguments": {}}</tool_call>')
    assert calls == [("other", {})]


@pytest.mark.parametrize(
    ("content", "at"),
    [
        ('Reading.\n<tool_call>\n{"name": "read_fi', 9),
        ('Reading.\n```json\n{\n  "name": "read_file",\n  "argum', 9),
        ('```json\n{"na', 0),
        ('  {"name": "read_file", "arguments": {"pa', 2),
        ("Reading.\n```json\n", 9),
        ('<tools>\n{"name": "read_file", "argu', 0),
    ],
)
def test_a_call_cut_by_the_length_limit_is_found(content, at):
    assert unfinished_call_at(content, NAMES) == at


@pytest.mark.parametrize(
    "content",
    [
        "plain text",
        "```python\nprint(1)",  # an unfinished ordinary code block is text
        '{"name": "Ada", "age": 3',  # an unfinished JSON answer naming no tool
        '```json\n{"port": 80',
        "```\nA\n```",
        "<tools>the list of tools",
    ],
)
def test_unfinished_text_that_is_no_call_is_kept(content):
    assert unfinished_call_at(content, NAMES) is None


# --- the stream's hold ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hold"),
    [
        ("Hello there", 11),
        ("Hello <tool", 6),  # may be the start of <tool_call>
        ("Hello ``", 6),  # may be the start of a fence
        ("Hi\n```json\n{", 3),  # a fenced call may be coming
        ('Hi\n```json\n{"port"', 18),  # a fenced JSON value, no call: shown
        ("Hi\n```python\nx = 1\n", 19),  # an ordinary code block streams as it comes
        ('```python\nx\n```\n```json\n{"name"', 16),  # the second block holds a call
        ('  {"na', 2),  # a bare call may be opening
        ('{"title": 1', 11),
        ("[1, 2", 5),
        ("Run it.\n<tools>\n", 8),  # a wrapped call may be coming
        ('Run it.\n<tools>\n{"na', 8),
        ("Run it.\n<tools> are listed", 26),  # the tag around text: shown
        ("Run it.\n<too", 8),  # may be the start of <tools> (or <tool_call>)
    ],
)
def test_the_hold_is_where_a_call_may_begin(text, hold):
    assert hold_of(text) == hold
    scan = CallScan()  # the same hold, fed one character at a time
    for ch in text:
        scan.feed(ch)
    assert (scan.hold() if scan.hold() is not None else len(text)) == hold
