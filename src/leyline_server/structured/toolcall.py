"""Forced and strict tool calls as xgrammar structural tags, in the chat template's own call syntax.

The server parses calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(``api/toolcalls.py``): the syntax of ChatML/Qwen-style templates and of the text form Leyline
renders for templates without tool syntax (``leyline_sdk.render.tool_text``). :func:`probe_layout` reads
the exact framing off the template (a newline after ``<tool_call>`` or not, what separates two
calls, whether the marker is one token), and :func:`tool_call_tag` builds the structural tag that
makes the model write calls in that framing:

* ``required``: one call (several, separated as the template separates them, when parallel calls
  are allowed) of any listed function, nothing else;
* a named function: exactly one call of it;
* ``auto``: free text, but once the model opens a call it must name a listed function and give
  arguments matching its schema. A call opens with the template's ``<tool_call>``, or with a code
  fence holding a call object (``` ```json ``` then ``{"name"``: what small models such as
  Qwen2.5-Coder write although their template asks for tags; :data:`FENCE_TRIGGERS`), or with
  the template's ``<tools>`` wrapped around a call object (:data:`WRAP_TRIGGERS`), the forms
  :mod:`leyline_server.api.toolcalls` parses. Where the marker is a special token (text cannot
  spell it) the call is triggered by that token alone;
* with a JSON ``response_format`` too: either calls, or the JSON answer.

Arguments follow each function's ``parameters`` schema, written as compact JSON (``", "`` and
``": "`` separators, as the templates render arguments), through the schema's EBNF grammar.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CallLayout",
    "ToolSpec",
    "probe_layout",
    "tool_call_tag",
    "json_grammar",
    "MARK_OPEN",
    "MARK_CLOSE",
    "FENCE_TRIGGERS",
    "WRAP_TRIGGERS",
]

MARK_OPEN, MARK_CLOSE = "<tool_call>", "</tool_call>"
# A fenced call object, as far as its first key: every way the models seen write it (the fence with
# or without ``json``; compact, two- and four-space indented, spaced). Once one is written the rest
# of the call is constrained; a fenced JSON value whose first key is not ``name`` stays free text.
FENCE_TRIGGERS = tuple(
    fence + brace
    for fence in ("```json\n", "```\n")
    for brace in ('{"name"', '{\n  "name"', '{\n    "name"', '{ "name"')
)
# A call object wrapped in ``<tools>`` (the tag around the template's tool list), and how it closes.
WRAP_TRIGGERS = ('<tools>\n{"name"', '<tools>{"name"')
_WRAP_END = {'<tools>\n{"name"': "}\n</tools>", '<tools>{"name"': "}</tools>"}
LOOSE_WHITESPACE = 12
# What follows each fence trigger, in the layout the trigger began: compact, or indented by two or four.
_FENCED_HEAD = {'{"name"': ": ", '{\n  "name"': ": ", '{\n    "name"': ": ", '{ "name"': ": "}
_FENCED_SEP = {'{"name"': ", ", '{\n  "name"': ",\n  ", '{\n    "name"': ",\n    ", '{ "name"': ", "}
_FENCED_END = {'{"name"': "}\n```", '{\n  "name"': "\n}\n```", '{\n    "name"': "\n}\n```", '{ "name"': " }\n```"}
_PROBE = ("leyline_probe_a", "leyline_probe_b")


@dataclass(frozen=True)
class CallLayout:
    """How a template frames tool calls: ``<open>{before}{payload}{after}<close>``, calls joined by ``between``.

    ``open_token``/``close_token``: the marker's id when the tokenizer has it as one token (it is
    then forced by id, which also works for special tokens that text cannot spell);
    ``special_marks``: the markers are special tokens (no text spells them).
    """

    before: str = ""
    after: str = ""
    between: str = ""
    open_token: int | None = None
    close_token: int | None = None
    special_marks: bool = False


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call: its name and the grammar of its arguments (:func:`json_grammar`).

    ``loose``: the same arguments with free whitespace (at most :data:`LOOSE_WHITESPACE` characters
    in a row), for calls the model opens on its own: forced into compact JSON, a small model that
    would have closed the object after its first property writes every optional one instead.
    """

    name: str
    grammar: str
    loose: str | None = None

    @property
    def free_grammar(self) -> str:
        """The grammar for a call the model opened itself (``loose`` when there is one)."""
        return self.loose or self.grammar


def _single_token(encode: Callable[[str], list[int]], text: str) -> int | None:
    ids = encode(text)
    return ids[0] if len(ids) == 1 else None


def probe_layout(
    render_text: Callable[..., str], encode: Callable[[str], list[int]], special_ids: Collection[int] = ()
) -> CallLayout | None:
    """The template's call framing, read from a rendered two-call message; ``None`` without ``<tool_call>``.

    ``special_ids``: the tokenizer's special tokens (markers among them are matched by id only).
    """
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": '{"x": 1}'}}
        for i, n in enumerate(_PROBE)
    ]
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in _PROBE]
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    try:
        text = render_text(messages, tools, False)
    except Exception:  # noqa: BLE001 - a template that cannot render calls has no layout
        return None
    # the first call's framing: the last mark before its payload (a tools block before the
    # conversation may show the mark too, as Leyline's own text form does in its instructions)
    named = max(text.rfind(f'"name": "{_PROBE[0]}"'), text.rfind(f'"name":"{_PROBE[0]}"'))
    first = text.rfind(MARK_OPEN, 0, named) if named >= 0 else text.find(MARK_OPEN)
    if first < 0:
        return None
    start = first + len(MARK_OPEN)
    payload_at = text.find("{", start)
    close_at = text.find(MARK_CLOSE, start)
    second = text.find(MARK_OPEN, close_at)
    if payload_at < 0 or close_at < payload_at or second < 0:
        return None
    segment = text[payload_at:close_at]
    payload = segment.rstrip()
    before, after = text[start:payload_at], segment[len(payload) :]
    between = text[close_at + len(MARK_CLOSE) : second]
    try:
        parsed = json.loads(payload)
    except json.JSONDecodeError:
        return None
    if parsed.get("name") != _PROBE[0] or before.strip() or between.strip():
        return None
    opening, closing = _single_token(encode, MARK_OPEN), _single_token(encode, MARK_CLOSE)
    special = opening in special_ids or closing in special_ids
    return CallLayout(before, after, between, opening, closing, special and None not in (opening, closing))


def json_grammar(schema: Any, loose: bool = False) -> str:
    """The EBNF grammar of JSON matching ``schema`` (xgrammar; raises on a schema it cannot take).

    Compact JSON, or with ``loose`` whitespace as the model likes it, each run of it bounded.
    """
    import xgrammar as xgr

    text = json.dumps(schema)
    if loose:
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=True, max_whitespace_cnt=LOOSE_WHITESPACE)
    else:
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
    return str(grammar)


def _text(value: str) -> list[dict[str, Any]]:
    return [{"type": "const_string", "value": value}] if value else []


def _marker(token: int | None, text: str) -> dict[str, Any]:
    return {"type": "token", "token": token} if token is not None else {"type": "const_string", "value": text}


def _body(layout: CallLayout, tool: ToolSpec) -> list[dict[str, Any]]:
    """The call between its markers: ``{before}{"name": ..., "arguments": <grammar>}{after}``."""
    head = layout.before + '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": '
    return [*_text(head), {"type": "grammar", "grammar": tool.grammar}, *_text("}" + layout.after)]


def _call(layout: CallLayout, tool: ToolSpec) -> dict[str, Any]:
    elements = [_marker(layout.open_token, MARK_OPEN), *_body(layout, tool), _marker(layout.close_token, MARK_CLOSE)]
    return {"type": "sequence", "elements": elements}


def _one_of(items: list[dict[str, Any]]) -> dict[str, Any]:
    return items[0] if len(items) == 1 else {"type": "or", "elements": items}


def _calls(layout: CallLayout, tools: Sequence[ToolSpec], parallel: bool) -> dict[str, Any]:
    one = _one_of([_call(layout, t) for t in tools])
    if not parallel:
        return one
    more = {"type": "sequence", "elements": [*_text(layout.between), one]} if layout.between else one
    return {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}


def _named(head: str, sep: str, tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """``{head}"<name>"{sep}"arguments": <its free grammar>`` for one of ``tools``."""
    bodies = [
        {
            "type": "sequence",
            "elements": [
                *_text(head + json.dumps(t.name, ensure_ascii=False) + sep + '"arguments": '),
                {"type": "grammar", "grammar": t.free_grammar},
            ],
        }
        for t in tools
    ]
    return _one_of(bodies)


def _triggered(layout: CallLayout, tools: Sequence[ToolSpec], parallel: bool) -> dict[str, Any]:
    """Free text; a call, once opened (a tag or a fenced call object), names a listed function, arguments matching."""
    if layout.special_marks:
        assert layout.open_token is not None and layout.close_token is not None
        tags = [
            {
                "type": "tag",
                "begin": {"type": "token", "token": layout.open_token},
                "content": {"type": "sequence", "elements": _body(layout, t)},
                "end": {"type": "token", "token": layout.close_token},
            }
            for t in tools
        ]
        return {
            "type": "token_triggered_tags",
            "trigger_tokens": [layout.open_token],
            "tags": tags,
            "stop_after_first": not parallel,
        }
    tagged = {
        "type": "tag",
        "begin": MARK_OPEN,
        "content": _named(layout.before + '{"name": ', ", ", tools),
        "end": "}" + layout.after + MARK_CLOSE,
    }
    fenced = []
    for trigger in FENCE_TRIGGERS:
        brace = trigger[trigger.index("{") :]
        content = _named(_FENCED_HEAD[brace], _FENCED_SEP[brace], tools)
        fenced.append({"type": "tag", "begin": trigger, "content": content, "end": _FENCED_END[brace]})
    wrapped = [
        {"type": "tag", "begin": trigger, "content": _named(": ", ", ", tools), "end": _WRAP_END[trigger]}
        for trigger in WRAP_TRIGGERS
    ]
    return {
        "type": "triggered_tags",
        "triggers": [MARK_OPEN, *FENCE_TRIGGERS, *WRAP_TRIGGERS],
        "tags": [tagged, *fenced, *wrapped],
        "stop_after_first": not parallel,
    }


def tool_call_tag(
    layout: CallLayout,
    tools: Sequence[ToolSpec],
    mode: str,
    parallel: bool,
    answer_grammar: str | None = None,
) -> dict[str, Any]:
    """The structural tag (``{"type": "structural_tag", "format": ...}``) for ``mode``.

    ``mode``: ``required`` (calls only; a named function is ``required`` over that one function,
    never parallel) or ``auto`` (free text with constrained calls). ``answer_grammar``: the JSON
    the answer must be when it is not a call (a JSON ``response_format``; the output is then calls
    or that JSON, nothing else).
    """
    calls = _calls(layout, tools, parallel)
    if answer_grammar is not None:
        fmt = {"type": "or", "elements": [calls, {"type": "grammar", "grammar": answer_grammar}]}
    elif mode == "auto":
        fmt = _triggered(layout, tools, parallel)
    else:
        fmt = calls
    return {"type": "structural_tag", "format": fmt}
