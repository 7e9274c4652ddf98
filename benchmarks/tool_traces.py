"""Deterministic tool-heavy agent traces for replay: reads, re-reads, greps, failing runs and retries.

``agent_session(seed, turns)`` gives the opening messages and, per turn, the messages the agent
appends (one assistant tool call and its result). Tool outputs have realistic, varied sizes
(log-normal around ~1.5k characters, capped at 8k by default); some reads repeat an earlier path, some
test runs fail and are retried. Nothing here needs a model: the agent's moves are scripted, so
every arm of a benchmark replays the same conversation.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

__all__ = ["TOOLS", "SYSTEM", "AgentSession", "agent_session"]

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to inspect and fix the repository."}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": text, "parameters": {"type": "object"}}}
    for name, text in (
        ("read_file", "Read a file"),
        ("grep", "Search the repository"),
        ("run_tests", "Run the test suite"),
        ("write_file", "Write a file"),
    )
]


@dataclass(frozen=True)
class AgentSession:
    """The opening messages and the messages appended at each turn."""

    opening: list[dict]
    turns: list[list[dict]]


def _size(rng: random.Random, cap: int) -> int:
    return min(cap, max(120, int(math.exp(rng.gauss(math.log(1500), 0.8)))))


def _file_body(rng: random.Random, path: str, chars: int) -> str:
    lines = []
    while sum(len(x) + 1 for x in lines) < chars:
        n = len(lines)
        lines.append(f"    value_{n} = config.get('{path}:{n}', {rng.randint(0, 999)})  # line {n}")
    return "\n".join(lines)[:chars]


def _output(rng: random.Random, tool: str, args: dict, failed: bool, cap: int = 8000) -> str:
    chars = _size(rng, cap)
    if tool == "run_tests":
        if failed:
            return "Traceback (most recent call last):\n" + _file_body(rng, "trace", chars) + "\nAssertionError"
        return "collected 42 items\n" + "." * 42 + f"\n42 passed in {rng.uniform(0.5, 9):.2f}s"
    if tool == "grep":
        return "\n".join(f"src/mod_{rng.randint(0, 20)}.py:{rng.randint(1, 400)}: config" for _ in range(chars // 40))
    if tool == "write_file":
        return f"wrote {len(args.get('content', ''))} bytes to {args['path']}"
    return _file_body(rng, args["path"], chars)


def _move(rng: random.Random, turn: int, paths: list[str], last_failed: bool) -> tuple[str, dict, bool]:
    """The agent's next tool call: retry a failed run, re-read, read something new, grep, test, write."""
    if last_failed:
        return "run_tests", {"target": "tests/"}, rng.random() < 0.3
    roll = rng.random()
    if roll < 0.15 and paths:
        return "read_file", {"path": rng.choice(paths)}, False  # a re-read
    if roll < 0.55:
        path = f"src/mod_{turn}_{rng.randint(0, 99)}.py"
        paths.append(path)
        return "read_file", {"path": path}, False
    if roll < 0.7:
        return "grep", {"pattern": f"config_{rng.randint(0, 9)}"}, False
    if roll < 0.85:
        return "run_tests", {"target": "tests/"}, rng.random() < 0.4
    path = rng.choice(paths) if paths else "src/new.py"
    return "write_file", {"path": path, "content": _file_body(rng, path, 300)}, False


def agent_session(seed: int, turns: int, max_chars: int = 8000) -> AgentSession:
    """A reproducible session of ``turns`` tool calls; no tool output longer than ``max_chars``."""
    rng = random.Random(seed)
    opening = [SYSTEM, {"role": "user", "content": f"Task {seed}: find why the configuration is not applied."}]
    steps, paths, failed = [], [], False
    for turn in range(turns):
        tool, args, failed = _move(rng, turn, paths, failed)
        call_id = f"call_{seed}_{turn}"
        call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
        steps.append(
            [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id, "content": _output(rng, tool, args, failed, max_chars)},
            ]
        )
    return AgentSession(opening, steps)
