"""JSON schemas as constrained decoding can enforce them (xgrammar 0.2.x, every engine's backend).

Two facts, checked against xgrammar 0.2.9 by sampling random outputs under each schema's mask and
validating them with ``jsonschema`` (``tests/server/test_grammar.py``):

* some keywords compile but are not enforced (``allOf``, ``oneOf`` taken as ``anyOf``, ``not``,
  ``if``/``then``/``else``, ``uniqueItems``, ``contains``, ``dependentRequired``, ``multipleOf``
  on numbers, unknown ``format`` s, ...). :func:`unenforced` lists them; such schemas are refused
  (a 400 naming the keyword and its place), so that every complete output validates;
* a string with ``minLength``/``maxLength`` lets raw control characters through, which makes the
  JSON unparseable. :func:`for_decoding` rewrites those bounds as the equivalent ``pattern``
  (``^.{min,max}$``, which xgrammar applies to the decoded value and escapes correctly).

The output is validated against the client's schema; only the grammar is built from the rewrite.

One gap remains, in xgrammar's UTF-8 automaton: it accepts overlong three-byte sequences (``E0``
followed by any continuation byte). Decoded, each such byte becomes U+FFFD, so a string bounded by
``maxLength`` can come out longer. Only a model that writes invalid UTF-8 byte by byte meets it
(random walks over byte tokens do; trained models do not).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

__all__ = ["unenforced", "for_decoding", "UNENFORCED", "FORMATS"]

UNENFORCED = frozenset(
    {
        "allOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
FORMATS = frozenset(
    {
        "date",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "json-pointer",
        "relative-json-pointer",
        "time",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
    }
)
_ONE = ("additionalProperties", "additionalItems", "items", "contains", "not", "if", "then", "else", "propertyNames")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _walk(schema: Any, where: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every (sub)schema with its JSON pointer; instance data (``enum``, ``const``, ``default``) is not entered."""
    if not isinstance(schema, dict):
        return
    yield schema, where
    for key in _ONE:
        child = schema.get(key)
        if isinstance(child, list):  # draft-4 tuple ``items``
            for i, item in enumerate(child):
                yield from _walk(item, f"{where}/{key}/{i}")
        else:
            yield from _walk(child, f"{where}/{key}")
    for key in _MANY:
        children = schema.get(key)
        if isinstance(children, list):
            for i, item in enumerate(children):
                yield from _walk(item, f"{where}/{key}/{i}")
    for key in _MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, item in children.items():
                yield from _walk(item, f"{where}/{key}/{str(name).replace('~', '~0').replace('/', '~1')}")


def _may_be_string(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def _integer_multiple(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "integer" and isinstance(schema.get("multipleOf"), int)


def unenforced(schema: Any) -> list[str]:
    """``"<json pointer>: <keyword>"`` for each part of ``schema`` decoding would not enforce."""
    found: list[str] = []
    for sub, where in _walk(schema, "#"):
        found += [f"{where}: {key}" for key in sorted(UNENFORCED.intersection(sub))]
        if "multipleOf" in sub and not _integer_multiple(sub):
            found.append(f"{where}: multipleOf (enforced on integers only)")
        fmt = sub.get("format")
        if _may_be_string(sub) and fmt is not None and (not isinstance(fmt, str) or fmt not in FORMATS):
            found.append(f"{where}: format {fmt!r}")
        if _may_be_string(sub):
            checks: list[str] = [k for k in ("format", "pattern") if k in sub]
            if "minLength" in sub or "maxLength" in sub:
                checks.append("minLength/maxLength")
            if len(checks) > 1:
                found.append(f"{where}: {' with '.join(checks)} (one string constraint at a time)")
    return found


def for_decoding(schema: Any) -> Any:
    """``schema`` with string length bounds written as patterns (see the module docstring); a copy."""
    out = copy.deepcopy(schema)
    for sub, _ in _walk(out, "#"):
        if not _may_be_string(sub) or "pattern" in sub or "format" in sub:
            continue
        low, high = sub.pop("minLength", None), sub.pop("maxLength", None)
        if low is None and high is None:
            continue
        sub["pattern"] = f"^.{{{int(low or 0)},{'' if high is None else int(high)}}}$"
    return out
