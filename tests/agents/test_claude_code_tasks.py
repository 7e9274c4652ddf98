"""Claude Code finishes real tasks on a real model through Leyline: it reads files with its own tool.

Qwen2.5-Coder-1.5B on the llama.cpp engine (``tests/agents/real_model.py``), Claude Code 2.1.197 as a
user runs it on a CPU (docs/integrations.md): ``--tools Read``, its memory off
(``CLAUDE_CODE_DISABLE_AUTO_MEMORY=1``: the memory instructions send a small model writing notes);
for the two-file task its system prompt replaced by a short one (``--system-prompt``: with Claude
Code's own, the 1.5B read both files and then asked what the question was). The prompts are the
ones that held over six pinned dates (``real_model.PINNED_DATE``: 2026-11-20 to 2027-03-02, 6 of
6); asked "use the Read tool twice … then tell me both codes", the 1.5B read both files on every
date and then, on 2026-12-06, re-read them until it gave up (docs/integrations.md).
The oracle is Claude Code's own record of the session (``--output-format stream-json``: the tool
uses it parsed out of the server's answers and the results it sent back) and the conversations the
server was asked to continue; the answer must hold what only the files say.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.clients import RefusingProxy, claude
from tests.agents.real_model import MODEL, Served, events, served_real_model, task_folder

NO_MEMORY = {"CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1"}
SHORT_SYSTEM_PROMPT = (
    "You are a coding assistant in a terminal. Use the Read tool to read files, one call per file. "
    "When the tool results hold what the user asked for, stop calling tools and answer in one short sentence."
)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_real_model() as server:
        yield server


def session(stdout: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(tool uses, tool results, final answer) as Claude Code recorded them."""
    uses, results, answer = [], [], ""
    for event in events(stdout):
        content = event.get("message", {}).get("content") if event.get("type") in ("assistant", "user") else None
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                uses.append(block)
            elif block.get("type") == "tool_result":
                results.append(block)
        if event.get("type") == "result":
            answer = str(event.get("result", ""))
    return uses, results, answer


def result_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    return content if isinstance(content, str) else str(content)


def run(served: Served, home: Path, proxy: RefusingProxy, prompt: str, system: str | None = None) -> tuple[Any, float]:
    start = time.perf_counter()
    done = claude(home, served.url, MODEL, prompt, proxy, max_output=512, timeout=1500, tools=["Read"],
                  env=NO_MEMORY, json_events=True, system_prompt=system)  # fmt: skip
    return done, time.perf_counter() - start


def test_claude_code_reads_a_file_with_its_read_tool_and_answers_from_it(served, proxy):
    home = task_folder("claude-calc")
    work = home / "work"
    (work / "calc.py").write_text("def answer():\n    # the value the service expects\n    return 7351\n")
    done, seconds = run(served, home, proxy, f"Read {work}/calc.py and tell me which number answer() returns.")
    assert done.returncode == 0, done.stderr[-3000:]
    uses, results, answer = session(done.stdout)
    reads = [u for u in uses if u["name"] == "Read" and u["input"].get("file_path", "").endswith("calc.py")]
    assert reads, uses  # the model called Claude Code's Read on the file, and Claude Code ran it
    assert any("7351" in result_text(r) and not r.get("is_error") for r in results), results
    assert served.saw("7351", "tool"), "the file's text never came back to the server"
    assert "7351" in answer, answer
    print(f"claude -p on {MODEL}: {len(uses)} tool uses, answered {answer!r} in {seconds:.0f} s")


def test_claude_code_reads_two_files_for_one_answer(served, proxy):
    home = task_folder("claude-codes")
    work = home / "work"
    (work / "launch.txt").write_text("The launch code is ALPHA-4471.\n")
    (work / "backup.txt").write_text("The backup code is BRAVO-9902.\n")
    prompt = f"Read {work}/launch.txt and {work}/backup.txt, then tell me the launch code and the backup code."
    done, seconds = run(served, home, proxy, prompt, system=SHORT_SYSTEM_PROMPT)
    assert done.returncode == 0, done.stderr[-3000:]
    uses, results, answer = session(done.stdout)
    read = {Path(u["input"].get("file_path", "")).name for u in uses if u["name"] == "Read"}
    assert {"launch.txt", "backup.txt"} <= read, uses  # two reads, each run by Claude Code
    texts = " ".join(result_text(r) for r in results)
    assert "ALPHA-4471" in texts and "BRAVO-9902" in texts, results
    assert served.saw("ALPHA-4471", "tool") and served.saw("BRAVO-9902", "tool")
    assert "ALPHA-4471" in answer and "BRAVO-9902" in answer, answer
    print(f"claude -p on {MODEL}: {len(uses)} tool uses, answered {answer!r} in {seconds:.0f} s")
