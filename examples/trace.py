"""A scripted tool-heavy agent trace (no model needed): the agent reads files turn after turn.

Used by the demo and ``agent_loop.py``; the model's own answers are ignored, the agent's moves
are fixed, so runs are comparable.
"""

from __future__ import annotations

import json

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to inspect the repository."}
TASK = {"role": "user", "content": "Find where the configuration is parsed and explain the bug."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    },
]


def tool_output(turn: int, lines: int = 30) -> str:
    """A deterministic file body of ``lines`` lines."""
    return "\n".join(f"def handler_{turn}_{i}(config):\n    return config.get('key_{i}')" for i in range(lines // 2))


def agent_turn(turn: int, lines: int = 30) -> list[dict]:
    """The agent's move in ``turn``: one tool call and its result."""
    name, args = (
        ("run", {"cmd": f"grep -n config src/mod_{turn}.py"})
        if turn % 3 == 2
        else ("read_file", {"path": f"src/mod_{turn}.py"})
    )
    call_id = f"call_{turn}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": tool_output(turn, lines)},
    ]
