"""The recorded Codex session (``benchmarks/traces/codex_session.jsonl``) holds Codex's own rewrites.

The trace is data recorded from the real Codex 0.171.0 on Qwen2.5-Coder-1.5B
(``benchmarks/record_agent_trace.py``); the replay benchmark reports its numbers for the requests
after each rewrite. The oracle is Codex's own compaction text: each request the replay counts as a
rewrite must follow Codex's summary request and open with Codex's summary hand-off, and every
other request must extend the one before it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_trace_replay import rewritten  # noqa: E402

TRACE = ROOT / "benchmarks" / "traces" / "codex_session.jsonl"
SUMMARY_PROMPT = "CONTEXT CHECKPOINT COMPACTION"  # Codex's local compaction prompt
HANDOFF = "Another language model started to solve this problem"  # how Codex hands the summary on


def texts(body: dict) -> list[str]:
    return [json.dumps(item) for item in body["input"]]


def test_the_trace_holds_codex_compactions_and_the_replay_finds_each():
    bodies = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    marks = rewritten(bodies)
    assert len(marks) >= 1, "no rewrite in the recorded session"
    for i in marks:
        assert SUMMARY_PROMPT in texts(bodies[i - 1])[-1], i  # the request before asked for the summary
        assert not bodies[i - 1].get("tools"), i  # ...as a side request, without tools
        assert any(HANDOFF in t for t in texts(bodies[i])), i  # this one goes on from the summary
        assert bodies[i].get("tools"), i
    for i in set(range(1, len(bodies))) - set(marks):
        assert json.dumps(bodies[i]["input"]).startswith(json.dumps(bodies[i - 1]["input"])[:-1]), i
