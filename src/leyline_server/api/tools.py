"""``tools``, ``tool_choice`` and ``parallel_tool_calls``: validated, and what they ask of decoding.

Only function tools exist here (OpenAI's ``custom`` tools and anything else: 400 naming
``tools.<i>.type``). ``tool_choice``: ``none`` (no calls parsed, no constraint), ``auto`` (the model
chooses; once it opens a call, the call must name a listed function and match its schema), ``required`` (at least
one call of a listed function, enforced), a named function (exactly one call of it, enforced),
or ``allowed_tools`` (``auto``/``required`` over a subset). ``parallel_tool_calls: false`` allows one
call (enforced where calls are, and only the first parsed call is returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leyline_server.api.errors import APIError

__all__ = ["ToolPlan", "plan_tools"]


@dataclass(frozen=True)
class ToolFunction:
    """One function tool: its name, arguments schema (``None``: any object) and ``strict``."""

    name: str
    parameters: dict[str, Any] | None
    strict: bool
    index: int


@dataclass(frozen=True)
class ToolPlan:
    """What the request's tools ask for: parse calls at all, constrain them, and how many."""

    parse: bool = False
    mode: str = "none"  # none | auto | required
    functions: tuple[ToolFunction, ...] = ()
    parallel: bool = True
    named: bool = False
    restricted: bool = False  # ``allowed_tools``: only a subset may be called

    @property
    def forced(self) -> bool:
        """Whether decoding must produce a call."""
        return self.mode == "required"

    @property
    def constrained(self) -> bool:
        """Whether tool calls are decoded under a grammar: whenever tools may be called.

        ``auto`` lets the model write text, but a call it opens must name an offered function and
        give arguments matching its schema (:mod:`leyline_server.structured.toolcall`).
        """
        return self.mode in ("auto", "required") and bool(self.functions)

    @property
    def enforced(self) -> bool:
        """Whether the request itself asks that calls be enforced (required, named, ``allowed_tools``, ``strict``)."""
        return self.forced or (self.mode == "auto" and (self.restricted or any(f.strict for f in self.functions)))

    @property
    def names(self) -> frozenset[str]:
        """The functions that may be called."""
        return frozenset(f.name for f in self.functions)


def _bad(message: str, param: str) -> APIError:
    return APIError(400, "invalid_request", message, param)


def _function(tool: Any, i: int) -> ToolFunction:
    where = f"tools.{i}"
    if not isinstance(tool, dict):
        raise _bad("a tool must be an object", where)
    kind = tool.get("type")
    if kind != "function":
        raise APIError(
            400, "unsupported_parameter", f"tool type {kind!r} is not supported: only 'function' tools", f"{where}.type"
        )
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad("a function tool needs a 'function' object", f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise _bad("a function needs a name (a string of 1 to 64 characters)", f"{where}.function.name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise _bad("'parameters' must be a JSON schema object", f"{where}.function.parameters")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("'strict' must be a boolean", f"{where}.function.strict")
    return ToolFunction(name, params, bool(strict), i)


def _functions(tools: Sequence[Any] | None) -> list[ToolFunction]:
    out = [_function(t, i) for i, t in enumerate(tools or [])]
    seen: set[str] = set()
    for f in out:
        if f.name in seen:
            raise _bad(f"two tools are named {f.name!r}", f"tools.{f.index}.function.name")
        seen.add(f.name)
    return out


def _pick(functions: list[ToolFunction], names: list[Any], param: str) -> tuple[ToolFunction, ...]:
    by_name = {f.name: f for f in functions}
    picked = []
    for name in names:
        if not isinstance(name, str) or name not in by_name:
            raise _bad(f"tool_choice names {name!r}, which is not in 'tools'", param)
        picked.append(by_name[name])
    return tuple(picked)


def _choice_name(ref: Any, param: str) -> Any:
    if not isinstance(ref, dict) or ref.get("type") != "function" or not isinstance(ref.get("function"), dict):
        raise APIError(400, "unsupported_parameter", "only function tools can be chosen", param)
    return ref["function"].get("name")


def plan_tools(tools: Sequence[Any] | None, choice: Any, parallel: bool | None) -> ToolPlan:
    """Validate the request's tool fields (400 naming the field) and say what decoding must do."""
    functions = _functions(tools)
    par = parallel is not False
    if choice is None:
        choice = "auto" if functions else "none"
    if choice == "none" or (choice == "auto" and not functions):
        return ToolPlan(parallel=par)
    if choice in ("auto", "required"):
        if not functions:
            raise _bad("tool_choice 'required' needs 'tools'", "tool_choice")
        return ToolPlan(True, choice, tuple(functions), par)
    if not isinstance(choice, dict):
        raise _bad("tool_choice must be 'none', 'auto', 'required' or an object", "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        picked = _pick(functions, [_choice_name(choice, "tool_choice")], "tool_choice.function.name")
        return ToolPlan(True, "required", picked, False, named=True)
    if kind == "allowed_tools":
        allowed = choice.get("allowed_tools")
        if not isinstance(allowed, dict) or allowed.get("mode") not in ("auto", "required"):
            raise _bad("allowed_tools needs mode 'auto' or 'required' and a list of tools", "tool_choice.allowed_tools")
        refs = allowed.get("tools")
        if not isinstance(refs, list) or not refs:
            raise _bad("allowed_tools.tools must list at least one tool", "tool_choice.allowed_tools.tools")
        names = [_choice_name(r, f"tool_choice.allowed_tools.tools.{i}") for i, r in enumerate(refs)]
        picked = _pick(functions, names, "tool_choice.allowed_tools.tools")
        # ``auto`` over a subset: only those functions may be called, so calls are constrained
        mode = allowed["mode"]
        return ToolPlan(True, mode, picked, par, restricted=True)
    raise APIError(400, "unsupported_parameter", f"tool_choice type {kind!r} is not supported", "tool_choice.type")
