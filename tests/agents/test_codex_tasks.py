"""Codex finishes a real task on a real model through Leyline: it runs a command with its own tool.

Qwen2.5-Coder-1.5B on the llama.cpp engine (``tests/agents/real_model.py``), Codex 0.171.0 as a user
runs it on a CPU (docs/integrations.md): its instructions replaced by a short file
(``model_instructions_file``; Codex's own 20k-character prompt costs a 2-core machine minutes per
turn and a 1.5B model follows the short one better). The oracle is Codex's own record of the run
(``codex exec --json``: each command it ran, with its exit code and output, and its last message)
and the conversations the server was asked to continue; the answer must hold what only the file says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.clients import RefusingProxy, codex
from tests.agents.real_model import MODEL, Served, events, served_real_model, task_folder

INSTRUCTIONS = (
    "You are a coding agent in a terminal. To look at files or run programs, call the exec_command "
    "tool with a shell command (for example `cat file.py` or `python file.py`) and read its output. "
    "When you know the answer, reply with it in one short sentence.\n"
)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_real_model() as server:
        yield server


def record(stdout: str) -> tuple[list[dict[str, Any]], str]:
    """(commands run, last agent message) as Codex recorded them."""
    commands, answer = [], ""
    for event in events(stdout):
        item = event.get("item") if event.get("type") == "item.completed" else None
        if not isinstance(item, dict):
            continue
        if item.get("type") == "command_execution":
            commands.append(item)
        elif item.get("type") == "agent_message":
            answer = str(item.get("text", ""))
    return commands, answer


def run(served: Served, home: Path, proxy: RefusingProxy, prompt: str) -> tuple[Any, float]:
    instructions = home / "instructions.md"
    instructions.write_text(INSTRUCTIONS)
    start = time.perf_counter()
    done = codex(home, served.url + "/v1", MODEL, prompt, proxy, timeout=1500, json_events=True,
                 settings=f'model_instructions_file = "{instructions}"\n')  # fmt: skip
    return done, time.perf_counter() - start


CALC = "def answer():\n    return 6 * 1000 + 1351\n\n\nprint(answer())\n"


def test_codex_runs_a_command_with_its_tool_and_answers_from_the_output(served, proxy):
    home = task_folder("codex-calc")
    (home / "work" / "calc.py").write_text(CALC)
    done, seconds = run(served, home, proxy, "Run `python calc.py` and tell me the number it prints.")
    assert done.returncode == 0, done.stderr[-3000:]
    commands, answer = record(done.stdout)
    ran = [c for c in commands if "calc.py" in str(c.get("command", "")) and c.get("exit_code") == 0]
    assert ran, commands  # the model called exec_command, and Codex ran it
    assert any("7351" in str(c.get("aggregated_output", "")) for c in ran), ran
    assert served.saw("7351", "tool"), "the command's output never came back to the server"
    assert "7351" in answer, answer  # only running (or reading and computing) the file gives it
    print(f"codex exec on {MODEL}: {len(commands)} commands, answered {answer!r} in {seconds:.0f} s")


def test_codex_edits_a_file_then_runs_it(served, proxy):
    home = task_folder("codex-edit")
    calc = home / "work" / "calc.py"
    calc.write_text(CALC)
    prompt = "In calc.py, change 1351 to 2351 (use sed), then run `python calc.py` and tell me the number it prints."
    done, seconds = run(served, home, proxy, prompt)
    assert done.returncode == 0, done.stderr[-3000:]
    commands, answer = record(done.stdout)
    assert "2351" in calc.read_text() and "1351" not in calc.read_text(), calc.read_text()  # the edit was made
    ran = [c for c in commands if "calc.py" in str(c.get("command", "")) and c.get("exit_code") == 0]
    assert any("8351" in str(c.get("aggregated_output", "")) for c in ran), commands  # then the file was run
    assert served.saw("8351", "tool"), "the run's output never came back to the server"
    assert "8351" in answer, answer
    print(f"codex exec on {MODEL}: {len(commands)} commands, answered {answer!r} in {seconds:.0f} s")
