"""One fallback vocabulary: every code is in the server's set or the SDK's, documented once, and used by name."""

from __future__ import annotations

import re
from pathlib import Path

from leyline_sdk.core.fallbacks import SDK_CODES, SERVER_CODES, BlockFallback, FallbackCode

ROOT = Path(__file__).resolve().parents[2]


def test_every_code_belongs_to_the_server_or_the_sdk():
    assert SERVER_CODES | SDK_CODES == set(FallbackCode)


def test_the_design_lists_every_code_once_in_its_table():
    text = (ROOT / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (server|SDK|server, SDK) \|", text, flags=re.M)
    assert sorted(code for code, _ in rows) == sorted(c.value for c in FallbackCode)
    for code, who in rows:
        assert (FallbackCode(code) in SERVER_CODES) == ("server" in who), code
        assert (FallbackCode(code) in SDK_CODES) == ("SDK" in who), code


def test_no_module_spells_a_code_out():
    pattern = re.compile(r'"(' + "|".join(c.value for c in FallbackCode) + r')"')
    spelled = []
    for path in (ROOT / "src").rglob("*.py"):
        if path.name == "fallbacks.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "``" not in code:  # docstrings quote them in ``double backticks``
                spelled.append(f"{path.relative_to(ROOT)}:{n}")
    assert not spelled, spelled


def test_block_reasons_are_their_own_set():
    assert {b.value for b in BlockFallback}.isdisjoint({"capacity", "span_invalid"})
