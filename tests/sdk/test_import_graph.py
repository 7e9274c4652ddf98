"""The SDK and the policy package depend one way: policies -> the SDK's pure core <- the SDK's client.

Checked twice: statically (every import statement of every module, function-level ones
included) and for real (what a fresh interpreter has loaded after importing one side).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "src" / "leyline_sdk"
POLICIES = ROOT / "policies"

# The pure core: what the server and the policy package may import. No HTTP, no openai.
PURE = {
    "align",
    "diff",
    "directives",
    "edits",
    "errata",
    "errors",
    "incremental",
    "policy",
    "policy_run",
    "rendering",
    "stats",
    "templates",
    "template_data",
    "tiny_tokenizer",
    "tool_text",
    "turns",
    "validation",
    "wire",
}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (never run)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def imports(path: Path) -> set[str]:
    """Every module a run-time import statement in ``path`` names (``from a.b import c``: ``a.b``, ``a.b.c``)."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sdk_modules(names: set[str]) -> set[str]:
    return {n.split(".")[1] for n in names if n.startswith("leyline_sdk.") and (SDK / f"{n.split('.')[1]}.py").exists()}


def test_every_pure_module_exists_and_every_other_one_is_client_side():
    modules = {p.stem for p in SDK.glob("*.py")} - {"__init__"}
    assert PURE <= modules
    assert {"client", "completions", "calls", "session", "routes"} <= modules - PURE


@pytest.mark.parametrize("path", sorted(SDK.glob("*.py")), ids=lambda p: p.name)
def test_the_sdk_never_imports_the_policy_package(path):
    assert not any(n == "leyline_policies" or n.startswith("leyline_policies.") for n in imports(path))


@pytest.mark.parametrize("path", sorted(SDK.glob("*.py")), ids=lambda p: p.name)
def test_pure_modules_import_only_pure_modules_and_never_openai(path):
    if path.stem not in PURE:
        return
    names = imports(path)
    assert not any(n == "openai" or n.startswith("openai.") or n.startswith("httpx") for n in names)
    assert sdk_modules(names) <= PURE, sdk_modules(names) - PURE


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.py")), ids=lambda p: p.name)
def test_policies_import_only_the_sdks_pure_core(path):
    names = imports(path)
    assert sdk_modules(names) <= PURE, sdk_modules(names) - PURE
    assert not any(n == "openai" or n.startswith("openai.") for n in names)


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_policies_loads_no_client_and_no_openai():
    loaded = loaded_after("import leyline_policies; leyline_policies.TruncateOlderThanN(2)")
    assert "leyline_sdk.edits" in loaded  # the contracts come from the SDK's core
    client_side = {f"leyline_sdk.{p.stem}" for p in SDK.glob("*.py")} - {f"leyline_sdk.{m}" for m in PURE}
    assert not (loaded & client_side), loaded & client_side
    assert "openai" not in loaded


@pytest.mark.parametrize("statement", ["import leyline_sdk.client", "from leyline_sdk import AsyncLeyline, Leyline"])
def test_importing_the_client_loads_no_policy_package(statement):
    loaded = loaded_after(statement)
    assert "leyline_sdk.client" in loaded and "openai" in loaded
    assert not any(m == "leyline_policies" or m.startswith("leyline_policies.") for m in loaded)
