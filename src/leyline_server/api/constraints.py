"""What a chat request asks the output to match: ``response_format``, SGLang's ``regex``/``ebnf``, and
forced or strict tool calls, as one engine :class:`~leyline_server.contract.base.Constraint`.

* ``response_format``: ``text`` (nothing), ``json_object`` (any JSON object), ``json_schema`` (the
  schema, whatever ``strict`` says: SGLang enforces it too), SGLang's ``structural_tag``;
* ``regex``, ``ebnf``: SGLang's fields, one output constraint at a time (400 otherwise);
* tools (``api.tools``): ``required``/named calls as a structural tag in the template's call
  syntax, and under ``auto`` a lazy one: free text, but a call the model opens names an offered
  function with arguments matching its schema (``structured.toolcall``); with a JSON
  ``response_format`` and tools under ``auto`` the answer is either calls or that JSON. A forced
  call together with an output constraint is a 400 (as SGLang answers); a ``regex``/``ebnf``
  output under ``auto`` leaves calls unconstrained unless the request asks them enforced
  (``strict`` functions, ``allowed_tools``: then a 400).

Schemas are checked first (a valid JSON Schema, nothing decoding would leave unenforced; 400 naming
the field), then rewritten for decoding (``structured.schema``). Compiling happens in the engine
(``Engine.check_constraint``); :class:`ConstraintPlan` keeps the field to name if it fails.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

from leyline_server.api.errors import APIError
from leyline_server.api.schema_budget import SchemaBudget
from leyline_server.api.tools import ToolPlan
from leyline_server.contract.values import Constraint
from leyline_server.structured.schema import for_decoding, unenforced
from leyline_server.structured.toolcall import CallLayout, ToolSpec, json_grammar, probe_layout, tool_call_tag

__all__ = ["ConstraintPlan", "plan_constraint", "call_layout"]

_OBJECT: dict[str, Any] = {"type": "object"}
_LAYOUTS: weakref.WeakKeyDictionary[Any, CallLayout | None] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ConstraintPlan:
    """The constraint to decode under and the request field it came from (named if it cannot compile)."""

    constraint: Constraint
    param: str


def call_layout(chat: Any) -> CallLayout | None:
    """The template's tool-call framing (probed once per renderer)."""
    if chat not in _LAYOUTS:
        special = getattr(getattr(chat, "tokenizer", None), "all_special_ids", None) or ()
        _LAYOUTS[chat] = probe_layout(chat.render_text, lambda text: chat.encode(text)[0], set(special))
    return _LAYOUTS[chat]


def _bad(message: str, param: str) -> APIError:
    return APIError(400, "invalid_schema", message, param)


def checked_schema(schema: Any, param: str, budget: SchemaBudget | None = None) -> Any:
    """``schema`` rewritten for decoding, if it is a JSON Schema decoding enforces fully (else 400 naming ``param``).

    ``budget``: the request's schema budget, charged first (before the validation, which costs
    seconds for a megabyte of ``$defs``).
    """
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise _bad("a JSON schema must be an object", param)
    if budget is not None:
        budget.charge(schema, param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(f"not a valid JSON schema: {exc.message}", param) from exc
    missing = unenforced(schema)
    if missing:
        raise _bad(f"constrained decoding cannot enforce {', '.join(missing)}", param)
    return for_decoding(schema)


def _response_format(fmt: dict[str, Any] | None, budget: SchemaBudget) -> tuple[str, Any, str] | None:
    """(kind, value, param) of the output constraint ``response_format`` asks for."""
    kind = (fmt or {}).get("type", "text")
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", _OBJECT, "response_format"
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad("response_format json_schema needs a 'json_schema' object", "response_format.json_schema")
        schema = spec.get("schema", True)
        return "json_schema", schema, "response_format.json_schema.schema"
    if kind == "structural_tag":
        return "structural_tag", _structural(fmt, budget), "response_format"
    raise APIError(400, "unsupported_parameter", f"response_format type {kind!r} is not supported", "response_format")


def _structural(fmt: dict[str, Any], budget: SchemaBudget) -> dict[str, Any]:
    """SGLang's structural-tag response format: xgrammar's own shape, or the legacy structures/triggers one."""
    if "format" in fmt:
        return {"type": "structural_tag", "format": fmt["format"]}
    structures, triggers = fmt.get("structures"), fmt.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise _bad("a structural_tag needs 'format', or 'structures' and 'triggers'", "response_format")
    tags = []
    for i, s in enumerate(structures):
        schema = checked_schema(s.get("schema", True), f"response_format.structures.{i}.schema", budget)
        content = {"type": "json_schema", "json_schema": schema}
        tags.append({"type": "tag", "begin": s.get("begin", ""), "content": content, "end": s.get("end", "")})
    at_least_one = bool(fmt.get("at_least_one", False))
    return {
        "type": "structural_tag",
        "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": at_least_one},
    }


def _output(
    response_format: dict[str, Any] | None, regex: str | None, ebnf: str | None, budget: SchemaBudget
) -> tuple[str, Any, str] | None:
    asked = [
        c
        for c in (_response_format(response_format, budget), ("regex", regex, "regex"), ("ebnf", ebnf, "ebnf"))
        if c and c[1] is not None
    ]
    if len(asked) > 1:
        names = ", ".join(c[2].split(".")[0] for c in asked)
        raise APIError(400, "invalid_request", f"only one output constraint at a time, got {names}", asked[1][2])
    return asked[0] if asked else None


def grammar_of(schema: Any, param: str, budget: SchemaBudget | None = None, loose: bool = False) -> str:
    """The decoding grammar of a checked JSON schema (400 naming ``param`` when xgrammar refuses it)."""
    try:
        return json_grammar(checked_schema(schema, param, budget), loose)
    except APIError:
        raise
    except Exception as exc:  # xgrammar's RuntimeError / ValueError
        raise _bad(f"constrained decoding cannot compile the schema: {_short(exc)}", param) from exc


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[-1] if text.startswith("[") else text


def _tool_specs(plan: ToolPlan, budget: SchemaBudget) -> list[ToolSpec]:
    """Each function's arguments grammar: its schema (strict: 400 if impossible; else any object)."""
    specs = []
    for f in plan.functions:
        schema: Any = f.parameters if f.parameters is not None else _OBJECT
        param = f"tools.{f.index}.function.parameters"
        try:
            grammar = grammar_of(schema, param, budget)
        except APIError:
            if f.strict:
                raise
            schema = _OBJECT  # not strict: OpenAI promises nothing about the arguments
            grammar = grammar_of(schema, param)
        specs.append(ToolSpec(f.name, grammar, grammar_of(schema, param, loose=True)))
    return specs


def plan_constraint(
    chat: Any, tools: ToolPlan, response_format: dict[str, Any] | None, regex: str | None, ebnf: str | None
) -> ConstraintPlan | None:
    """The request's constraint (``None``: free decoding); 400 naming the field for what cannot be honoured.

    Every schema it enforces is charged to one :class:`~leyline_server.api.schema_budget.SchemaBudget`
    before it is validated: past the limits, 400 ``schema_too_complex`` naming the schema.
    """
    budget = SchemaBudget()
    output = _output(response_format, regex, ebnf, budget)
    is_json = output is not None and output[0] == "json_schema"
    if output is not None and is_json:
        output = ("json_schema", checked_schema(output[1], output[2], budget), output[2])
    # calls are constrained whenever tools may be called, unless the request's own output constraint
    # (regex, ebnf, a structural tag) takes the grammar and nothing asked that calls be enforced
    lazy_only = output is not None and not is_json and not tools.enforced
    if not tools.constrained or lazy_only:
        if output is None:
            return None
        kind, value, param = output
        text = value if isinstance(value, str) else json.dumps(value)
        return ConstraintPlan(Constraint.model_validate({"kind": kind, "value": text}), param)
    if output is not None and (tools.forced or output[0] != "json_schema"):
        raise APIError(
            400,
            "invalid_request",
            "a forced tool call cannot be combined with an output constraint (response_format, regex or ebnf)",
            "tool_choice" if tools.forced else output[2],
        )
    layout = call_layout(chat)
    if layout is None and output is None and not (tools.forced or tools.restricted):
        return None  # ``auto`` with strict functions: strict cannot be enforced here (docs/design.md §7)
    if layout is None:
        raise APIError(
            400,
            "unsupported_parameter",
            "this model's chat template does not write tool calls as <tool_call>...</tool_call>, "
            "so calls cannot be forced or constrained",
            "tool_choice",
        )
    answer = grammar_of(output[1], output[2]) if output is not None else None
    tag = tool_call_tag(layout, _tool_specs(tools, budget), tools.mode, tools.parallel, answer)
    return ConstraintPlan(Constraint(kind="structural_tag", value=json.dumps(tag)), "tools")
