"""Realistic OpenAI-format agent transcripts for policy tests."""

from __future__ import annotations

import json


def call(cid, name, **args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def make_conversation():
    """A debugging session: parallel reads, a failed test run that is retried, a re-read after a write."""
    return [
        {"role": "system", "content": "You are a coding agent."},  # 0
        {"role": "user", "content": "The tests fail. Fix them."},  # 1
        {
            "role": "assistant",
            "content": "Reading both files.",  # 2
            "tool_calls": [call("c1", "read_file", path="app.py"), call("c2", "read_file", path="test_app.py")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n" * 10},  # 3
        {"role": "tool", "tool_call_id": "c2", "content": "def test_add():\n    assert add(1, 2) == 3\n"},  # 4
        {"role": "assistant", "content": None, "tool_calls": [call("c3", "run", cmd="pytest")]},  # 5
        {"role": "tool", "tool_call_id": "c3", "content": "Error: ModuleNotFoundError: no module named app"},  # 6
        {"role": "assistant", "content": None, "tool_calls": [call("c4", "run", cmd="pytest")]},  # 7
        {"role": "tool", "tool_call_id": "c4", "content": "FAILED test_app.py::test_add - assert -1 == 3"},  # 8
        {
            "role": "assistant",
            "content": None,  # 9
            "tool_calls": [call("c5", "write_file", path="app.py", content="def add(a, b):\n    return a + b\n")],
        },
        {"role": "tool", "tool_call_id": "c5", "content": "wrote 32 bytes"},  # 10
        {"role": "assistant", "content": None, "tool_calls": [call("c6", "read_file", path="app.py")]},  # 11
        {"role": "tool", "tool_call_id": "c6", "content": "def add(a, b):\n    return a + b\n"},  # 12
        {"role": "assistant", "content": None, "tool_calls": [call("c7", "run", cmd="pytest")]},  # 13
        {"role": "tool", "tool_call_id": "c7", "content": "1 passed"},  # 14
        {"role": "assistant", "content": "Fixed: add used subtraction."},  # 15
    ]


OLD_APP = "def add(a, b):\n    return a - b\n"
NEW_APP = "def add(a, b):\n    return a + b\n"


def read_write_conversation(reread: bool = False):
    """Read app.py, rewrite it, (optionally read it again), run the tests: a fact changed at 4."""
    messages = [
        {"role": "system", "content": "You are a coding agent."},  # 0
        {"role": "user", "content": "add() is wrong. Fix it."},  # 1
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "read_file", path="app.py")]},  # 2
        {"role": "tool", "tool_call_id": "c1", "content": OLD_APP},  # 3
        {
            "role": "assistant",
            "content": "It subtracts; fixing.",  # 4
            "tool_calls": [call("c2", "write_file", path="app.py", content=NEW_APP)],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "wrote 32 bytes"},  # 5
    ]
    if reread:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call("c3", "read_file", path="app.py")]},  # 6
            {"role": "tool", "tool_call_id": "c3", "content": NEW_APP},  # 7
        ]
    return messages


def later_turns(start: int, count: int):
    """``count`` more agent turns: each runs a command and gets its output (call ids from ``start``)."""
    out = []
    for k in range(start, start + count):
        out += [
            {"role": "assistant", "content": None, "tool_calls": [call(f"r{k}", "run", cmd=f"pytest -k t{k}")]},
            {"role": "tool", "tool_call_id": f"r{k}", "content": f"{k} passed in 0.0{k}s"},
        ]
    return out
