"""The README's demo (examples/walkthrough.py) runs and verifies its own result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_walkthrough_runs_and_verifies():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "walkthrough.py")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "verified: apply(old, directives) == new" in out.stdout
    assert "stub (amortize)            applied=True" in out.stdout
    assert "mode=forget" in out.stdout and "mode=amortize" in out.stdout
