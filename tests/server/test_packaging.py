"""The package list in ``pyproject.toml`` is every package of the tree.

setuptools puts exactly the listed packages into a wheel (an editable install finds unlisted ones
all the same, so the test tiers never notice a missing one): the SDK's six layers and the server's
protocol adapters were once missing from every wheel, and ``import leyline_sdk`` failed there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def packages_in_the_tree() -> set[str]:
    """Every folder with an ``__init__.py`` under ``src/`` (by import name) and ``policies/``."""
    found = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in (ROOT / "src").rglob("__init__.py")}
    found |= {".".join(("leyline_policies", *p.parent.relative_to(ROOT / "policies").parts))
              for p in (ROOT / "policies").rglob("__init__.py")}  # fmt: skip
    return found


def test_pyproject_lists_every_package_and_only_those():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; the project supports 3.10)
    block = re.search(r"^\[tool\.setuptools\]$.*?^packages = \[(.*?)^\]", text, flags=re.M | re.S)
    assert block is not None, "no packages list under [tool.setuptools]"
    listed = re.findall(r'"([\w.]+)"', block.group(1))
    assert len(listed) == len(set(listed))
    assert set(listed) == packages_in_the_tree()


def test_the_tree_walk_finds_nested_packages():
    found = packages_in_the_tree()
    assert {"leyline_sdk.core", "leyline_server.api.messages_api", "leyline_policies"} <= found
