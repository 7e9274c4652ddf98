"""The walk counter (``benchmarks/turn_walk.py``) and the walk ``docs/architecture.md`` describes.

* the counter against a walk worked by hand;
* every file the architecture page names in its turn-in-order walk is one the traced SDK turn's
  code runs in (client or server side): the page cannot name a file the turn never enters.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from turn_walk import SDK_TURN, trace_turns, walk_of  # noqa: E402


def test_the_counter_matches_a_walk_worked_by_hand():
    entries = [(1, "a"), (1, "a"), (1, "b"), (1, "a"), (2, "a"), (1, "c"), (1, "b"), (2, "c"), (2, "a")]
    walk = walk_of(entries)
    assert walk.files == ("a", "b", "c")
    # thread 1: a, b, a (back), c, b (back); thread 2: a, c, a (back)
    assert walk.returns == 3


def test_every_file_the_architecture_walk_names_runs_in_the_turn():
    walk = (ROOT / "docs" / "architecture.md").read_text().split("## One turn, in order")[1].split("\n## ")[0]
    named = set(re.findall(r"^\d+\. `(src/[\w/]+\.py)`", walk, flags=re.M))
    assert len(named) >= 14, named
    client, server = trace_turns(plain=False)[SDK_TURN]
    assert "src/leyline_server/splice/execute.py" in server.files  # the traced turn was spliced
    assert named <= set(client.files) | set(server.files), sorted(named - set(client.files) - set(server.files))
