"""The import rules, checked on every import statement (function-level, lazy and ``TYPE_CHECKING`` ones too).

* The SDK's layers are its folders, in this order; a module imports only its own layer and the
  layers before it: ``core`` → ``render`` → ``explain`` → ``policy`` → ``session`` → ``client``.
* Only ``client`` imports openai; the server and ``leyline_policies`` import the first four layers
  only; the SDK never imports ``leyline_policies``.
* No import circle anywhere in ``src/`` or ``policies/`` (between any number of modules).
* The server's folders (``api``, ``engines``, ``splice``, ``contract``…) import each other without
  a circle either: the engine contract sits below both the engines and the splice executor.
* The server's wire protocols (Chat Completions, the Responses API, the Messages API) are adapters
  onto one chat turn: none imports another; what two share lives below them in ``api/``.

Checked statically (the graph of import statements) and for real (what a fresh interpreter has
loaded after importing one side).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "src" / "leyline_sdk"
POLICIES = ROOT / "policies"
LAYERS = ["core", "render", "explain", "policy", "session", "client"]
SHARED_WITH_THE_SERVER = set(LAYERS[:4])  # what the server and leyline_policies may import


def module_files() -> dict[str, Path]:
    """Every module of ``src/`` and ``policies/`` by its import name."""
    out: dict[str, Path] = {}
    for base, prefix in ((ROOT / "src", ""), (POLICIES, "leyline_policies.")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = prefix + ".".join(parts) if parts else prefix.rstrip(".")
            out[name] = path
    return out


MODULES = module_files()


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


@functools.cache
def imported_names(name: str, path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a.b import c``: ``a.b`` and ``a.b.c``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(name, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (a package's own ``__init__`` not counted as an edge)."""
    out: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = set()
        for target in imported_names(name, path):
            r = _resolve(target)
            if r and r != name and not name.startswith(r + "."):
                edges.add(r)
        out[name] = edges
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str | None:
    """The SDK layer of a module (``None`` for the SDK's root package and anything outside it)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "leyline_sdk" and len(parts) > 1 and parts[1] in LAYERS else None


def test_the_sdk_folders_are_exactly_the_layers():
    folders = {p.name for p in SDK.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"assets"}
    assert folders == set(LAYERS)
    assert not [p.name for p in SDK.glob("*.py") if p.name != "__init__.py"], "every SDK module lives in a layer"


def test_no_import_circle_in_src_or_policies():
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m)), ids=str)
def test_a_layer_imports_only_itself_and_the_layers_before_it(module):
    edges = graph()[module]
    mine = LAYERS.index(layer(module))
    later = {t for t in edges if t.startswith("leyline_sdk") and (layer(t) is None or LAYERS.index(layer(t)) > mine)}
    assert not later, f"{module} ({LAYERS[mine]}) imports later layers: {sorted(later)}"


@pytest.mark.parametrize("module", sorted(MODULES), ids=str)
def test_only_the_client_layer_imports_openai_and_nothing_imports_policies_from_the_sdk(module):
    names = imported_names(module, MODULES[module])
    uses_openai = any(n == "openai" or n.startswith(("openai.", "httpx")) for n in names)
    if module.startswith("leyline_sdk"):
        assert not uses_openai or layer(module) == "client", module
        assert not any(n == "leyline_policies" or n.startswith("leyline_policies.") for n in names)


def private_openai(names: set[str]) -> set[str]:
    """The names in ``names`` that reach into openai's private modules (``openai._utils``, ``openai._compat``…)."""
    return {n for n in names if n.startswith("openai.") and any(part.startswith("_") for part in n.split(".")[1:])}


def test_the_private_module_check_finds_one():
    assert private_openai({"openai", "openai.types.chat", "openai._utils.maybe_transform"}) == {
        "openai._utils.maybe_transform"
    }


@pytest.mark.parametrize("module", sorted(MODULES), ids=str)
def test_nothing_imports_openais_private_modules(module):
    """openai-python's underscored modules change without notice; the SDK stays on its public surface."""
    assert not private_openai(imported_names(module, MODULES[module])), module


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if m.startswith(("leyline_server", "leyline_policies"))), ids=str
)
def test_the_server_and_the_policies_import_only_the_shared_layers(module):
    sdk = {t for t in graph()[module] if t.startswith("leyline_sdk.")}
    assert {layer(t) for t in sdk} <= SHARED_WITH_THE_SERVER, sorted(sdk)


def server_folder(module: str) -> str | None:
    """The folder of ``leyline_server`` a module lives in (``cli`` for a top-level module ``cli``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "leyline_server" and len(parts) > 1 else None


def folder_graph() -> dict[str, set[str]]:
    """Folder → the other folders of ``leyline_server`` its modules import."""
    out: dict[str, set[str]] = {}
    for module, targets in graph().items():
        mine = server_folder(module)
        if mine is not None:
            out.setdefault(mine, set()).update(t for t in map(server_folder, targets) if t not in (None, mine))
    return out


def test_the_servers_folders_import_each_other_without_a_circle():
    folders = folder_graph()
    assert cycles(folders) == []
    assert "engines" not in folders["splice"] | folders["contract"]  # the contract and the executor below
    assert folders["engines"] >= {"contract", "splice"}  # the engines above both


PROTOCOLS = {
    "chat": ("leyline_server.api.chat_routes", "leyline_server.api.completion_shapes"),
    "responses": ("leyline_server.api.responses_api",),
    "messages": ("leyline_server.api.messages_api",),
}


def protocol(module: str) -> str | None:
    """The wire protocol whose adapter ``module`` belongs to (``None``: shared, or not the server's API)."""
    for name, prefixes in PROTOCOLS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    return None


def test_every_protocol_names_modules_that_exist():
    for prefixes in PROTOCOLS.values():
        assert all(any(m == p or m.startswith(p + ".") for m in MODULES) for p in prefixes), prefixes


@pytest.mark.parametrize("module", sorted(m for m in MODULES if protocol(m)), ids=str)
def test_no_protocol_adapter_imports_another(module):
    others = {t for t in graph()[module] if protocol(t) not in (None, protocol(module))}
    assert not others, f"{module} ({protocol(module)}) imports another protocol's modules: {sorted(others)}"


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_policies_loads_no_session_no_client_and_no_openai():
    loaded = loaded_after("import leyline_policies; leyline_policies.TruncateOlderThanN(2)")
    assert "leyline_sdk.policy.edits" in loaded  # the contracts come from the SDK's policy layer
    assert not {m for m in loaded if layer(m) in ("session", "client")}
    assert "openai" not in loaded


@pytest.mark.parametrize(
    "statement", ["import leyline_sdk.client.client", "from leyline_sdk import AsyncLeyline, Leyline"]
)
def test_importing_the_client_loads_no_policy_package(statement):
    loaded = loaded_after(statement)
    assert "leyline_sdk.client.client" in loaded and "openai" in loaded
    assert not any(m == "leyline_policies" or m.startswith("leyline_policies.") for m in loaded)
