"""The llama-server race's scenario and table (``benchmarks/bench_vs_llama_server.py``).

The race itself needs llama.cpp's own server (``make peer``, ~8 minutes to build), which the test
tiers do not build; its numbers live in ``docs/results/vs_llama_server.md``. What is checked here is
that both servers are handed the edits the docs describe: a stub in place of the old tool output,
or the output deleted with the assistant line that asked for it, turns alternating either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_vs_llama_server import conversation, edited, table, text_of  # noqa: E402


def _alternate(msgs: list[dict[str, str]]) -> bool:
    roles = [m["role"] for m in msgs[1:]]
    return all(a != b for a, b in zip(roles, roles[1:], strict=False)) and roles[0] == "user"


@pytest.mark.parametrize("downstream", [500, 1000, 4000])
def test_the_conversation_holds_the_output_then_the_downstream_turns(downstream):
    msgs = conversation(3, downstream)
    assert msgs[0]["role"] == "system" and _alternate(msgs)
    assert msgs[3]["content"].startswith("Tool output:\nline 0: value_0 = compute(")
    assert msgs[3]["content"].count("\n") == 100  # the header line and 100 output lines
    tail = "".join(m["content"] for m in msgs[4:])
    assert abs(len(tail) - downstream * 3.4) < 0.1 * downstream * 3.4 + 200  # ~3.4 characters a token
    assert conversation(3, downstream) == msgs and conversation(4, downstream)[1] != msgs[1]  # seeded, distinct


def test_a_stub_replaces_the_output_and_nothing_else():
    msgs = conversation(1, 1000)
    nxt = edited(msgs, "Look at f.", "stub")
    assert nxt[3]["content"] == "Tool output:\n[tool output elided: 100 lines]"
    assert nxt[:3] == msgs[:3] and nxt[4:-2] == msgs[4:]
    assert nxt[-3]["content"].endswith("Which function should change first?")
    assert nxt[-2:] == [{"role": "assistant", "content": "Look at f."}, {"role": "user", "content": "And after that?"}]
    assert _alternate(nxt)


def test_a_deletion_drops_the_output_and_the_line_that_asked_for_it():
    msgs = conversation(1, 1000)
    nxt = edited(msgs, "", "delete")
    assert nxt[:2] == msgs[:2] and "Reading the file." not in str(nxt) and "Tool output" not in str(nxt)
    assert nxt[2:-2] == msgs[4:] and nxt[-2]["content"] == "."  # an empty reply still leaves a turn
    assert _alternate(nxt)


def test_text_is_cut_from_the_docs_at_seeded_places():
    assert len(text_of(100, 0)) == 340 and text_of(100, 1) != text_of(100, 2)


def test_the_table_gives_medians_ranges_and_agreement_counts():
    results = {
        "leyline": {"cold prefill (s)": [3.0, 1.0, 2.0], "agreement": [(True, True), (True, False)]},
        "peer": {"cold prefill (s)": [5.0, 4.0], "agreement": [(False, False)]},
    }
    lines = table(results, "m").splitlines()
    assert lines[2] == "| column | leyline | peer |"
    assert lines[4] == "| cold prefill (s) | 2.00 (1.00–3.00) | 4.50 (4.00–5.00) |"
    assert (
        lines[5]
        == "| agreement with a fresh prefill | first token 2/2, 16 tokens 1/2 | first token 0/1, 16 tokens 0/1 |"
    )
