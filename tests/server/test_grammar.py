"""Constrained decoding's masks against ``jsonschema`` and the tool-call parser, by random walks.

A random walk picks any token the mask allows (no model): whatever it completes must validate.
That is stronger than a model's greedy output, which explores one path; it is also how the list
of keywords xgrammar does not enforce (``structured.schema``) was found, and the tests keep it
honest: a refused keyword really breaks outputs, an accepted one never does.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from leyline_server.api.toolcalls import parse_tool_calls
from leyline_server.contract.values import Constraint, ConstraintError
from leyline_server.engines.grammar import GrammarBackend
from leyline_server.structured.schema import for_decoding, unenforced
from leyline_server.structured.toolcall import CallLayout, ToolSpec, json_grammar, probe_layout, tool_call_tag

EOS = 2


@pytest.fixture(scope="module")
def backend(hf_tokenizer) -> GrammarBackend:
    return GrammarBackend(hf_tokenizer, 1024, [EOS])


def walks(backend, constraint, tokenizer, trials=40, steps=80, seed=0):
    """(completed?, text) for random walks under ``constraint``'s mask."""
    rng = random.Random(seed)
    out = []
    for _ in range(trials):
        mask, ids = backend.mask(constraint), []
        for _ in range(steps):
            logits = torch.zeros(1024)
            mask.apply(logits)
            allowed = torch.isfinite(logits).nonzero().flatten().tolist()
            token = EOS if EOS in allowed and rng.random() < 0.4 else rng.choice(allowed)
            mask.accept(token)
            if mask.finished:
                break
            ids.append(token)
        out.append((mask.finished, tokenizer.decode(ids)))
    return out


def schema_constraint(schema) -> Constraint:
    return Constraint(kind="json_schema", value=json.dumps(for_decoding(schema)))


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": -3, "maximum": 40}}, "required": ["a"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "minLength": 2, "maxLength": 5},  # rewritten as a pattern (control characters otherwise)
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}, "required": ["s"]},
    {"enum": ["x", 1, None, True]},
    {"type": "string", "format": "date"},
    {"type": "integer", "multipleOf": 7},
    {
        "$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}},
        "$ref": "#/$defs/n",
    },
    {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"]}]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:40] for s in SCHEMAS])
def test_every_completed_walk_validates(backend, hf_tokenizer, schema):
    assert unenforced(schema) == []
    done = [text for finished, text in walks(backend, schema_constraint(schema), hf_tokenizer) if finished]
    assert len(done) >= 10
    for text in done:
        value = json.loads(text)  # always parses
        if "\ufffd" in text:  # overlong UTF-8 from xgrammar's byte automaton (structured.schema): may be long
            continue
        jsonschema.validate(value, schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        {"allOf": [{"type": "object", "required": ["a"]}, {"properties": {"a": {"maximum": 3}}}]},
        {"not": {"type": "integer"}},
        {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 2},
        {"type": "number", "multipleOf": 0.5},
    ],
    ids=["oneOf", "allOf", "not", "uniqueItems", "multipleOf-number"],
)
def test_refused_keywords_really_are_not_enforced(backend, hf_tokenizer, schema):
    assert unenforced(schema)  # refused by the server ...
    constraint = Constraint(kind="json_schema", value=json.dumps(schema))
    texts = [text for finished, text in walks(backend, constraint, hf_tokenizer, seed=1) if finished]
    broken = 0
    for text in texts:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (jsonschema.ValidationError, OverflowError):  # huge numbers overflow jsonschema's multipleOf
            broken += 1
    assert broken  # ... because xgrammar would let invalid outputs through


def test_length_bounds_break_json_without_the_rewrite(backend, hf_tokenizer):
    schema = {"type": "string", "maxLength": 6}
    raw = Constraint(kind="json_schema", value=json.dumps(schema))
    unparseable = 0
    for finished, text in walks(backend, raw, hf_tokenizer, trials=60, seed=1):
        if finished:
            try:
                json.loads(text)
            except json.JSONDecodeError:
                unparseable += 1
    assert unparseable  # raw control characters inside the string
    assert for_decoding(schema) == {"type": "string", "pattern": "^.{0,6}$"}


def test_unenforced_names_the_place():
    schema = {"type": "object", "properties": {"a/b": {"type": "string", "format": "color", "not": {}}}}
    assert unenforced(schema) == ["#/properties/a~1b: not", "#/properties/a~1b: format 'color'"]


def test_bad_constraints_raise_constraint_error(backend):
    for kind, value in [("regex", "("), ("ebnf", "root ::= undefined_rule"), ("json_schema", "{")]:
        with pytest.raises(ConstraintError):
            backend.compile(Constraint(kind=kind, value=value))


A = {"type": "object", "properties": {"x": {"enum": [1, 2]}, "ok": {"type": "boolean"}}, "required": ["x", "ok"]}
B = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}
TOOLS = [ToolSpec("fa", json_grammar(A)), ToolSpec("fb", json_grammar(B))]


def tag(layout, tools, mode, parallel, answer=None) -> Constraint:
    return Constraint(kind="structural_tag", value=json.dumps(tool_call_tag(layout, tools, mode, parallel, answer)))


def test_the_tiny_template_frames_calls_with_special_tokens(chat):
    layout = probe_layout(chat.render_text, lambda t: chat.encode(t)[0], set(chat.tokenizer.all_special_ids))
    assert layout == CallLayout("", "", "", open_token=3, close_token=4, special_marks=True)


def walk_after(backend, constraint, tokenizer, prefix: str, trials=30, steps=60, seed=1):
    """(completed?, text) of random walks that first write ``prefix`` (each of its tokens must be allowed)."""
    rng, out = random.Random(seed), []
    for _ in range(trials):
        mask, ids = backend.mask(constraint), tokenizer(prefix, add_special_tokens=False)["input_ids"]
        for token in ids:
            logits = torch.zeros(1024)
            mask.apply(logits)
            assert torch.isfinite(logits[token]), (prefix, tokenizer.decode([token]))
            mask.accept(token)
        for _ in range(steps):
            logits = torch.zeros(1024)
            mask.apply(logits)
            allowed = torch.isfinite(logits).nonzero().flatten().tolist()
            token = EOS if EOS in allowed and rng.random() < 0.3 else rng.choice(allowed)
            mask.accept(token)
            if mask.finished:
                break
            ids.append(token)
        out.append((mask.finished, tokenizer.decode(ids)))
    return out


@pytest.mark.parametrize(
    "opening",
    [
        'Sure.\n```json\n{\n  "name"',
        'Ok ```\n{"name"',
        "Then <tool_call>",
        '```json\n{ "name"',
        'Run\n<tools>\n{"name"',
    ],
)
def test_auto_lets_text_through_and_constrains_a_call_once_opened(backend, hf_tokenizer, opening):
    layout = CallLayout("\n", "\n", "\n")  # markers written as text (Qwen's are ordinary tokens)
    done = [t for f, t in walk_after(backend, tag(layout, TOOLS, "auto", False), hf_tokenizer, opening) if f]
    assert len(done) >= 10
    for text in done:
        content, calls = parse_tool_calls(text, {"fa", "fb"})
        assert len(calls) == 1, text  # the call opened: it names an offered function, its arguments validate
        schema = {"fa": A, "fb": B}[calls[0]["function"]["name"]]
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema)
        assert content.startswith(opening.split("```")[0].split("<tool_call>")[0].split("<tools>")[0])


def test_auto_leaves_ordinary_json_and_code_blocks_free(backend, hf_tokenizer):
    layout = CallLayout("\n", "\n", "\n")
    constraint = tag(layout, TOOLS, "auto", True)
    for text in ('```json\n{"port": 80}\n```', '```python\nname = {"name": 1}\n```', "plain words"):
        walked = walk_after(backend, constraint, hf_tokenizer, text, trials=1, steps=0)
        assert walked[0][1] == text


def test_auto_refuses_a_function_nobody_offered(backend, hf_tokenizer):
    layout = CallLayout("\n", "\n", "\n")
    mask = backend.mask(tag(layout, TOOLS, "auto", False))
    for token in hf_tokenizer('```json\n{"name": "', add_special_tokens=False)["input_ids"]:
        mask.accept(token)
    logits = torch.zeros(1024)
    mask.apply(logits)
    allowed = {hf_tokenizer.decode([t]) for t in torch.isfinite(logits).nonzero().flatten().tolist()}
    assert allowed and all("fa".startswith(a) or "fb".startswith(a) for a in allowed), allowed


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_always_parse_and_validate(backend, hf_tokenizer, chat, parallel):
    layout = probe_layout(chat.render_text, lambda t: chat.encode(t)[0])
    done = [t for f, t in walks(backend, tag(layout, TOOLS, "required", parallel), hf_tokenizer) if f]
    assert len(done) >= 10
    for text in done:
        content, calls = parse_tool_calls(text)
        assert content == "" and calls and (parallel or len(calls) == 1)
        for call in calls:
            schema = {"fa": A, "fb": B}[call["function"]["name"]]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


def test_a_named_function_is_the_only_call(backend, hf_tokenizer, chat):
    layout = probe_layout(chat.render_text, lambda t: chat.encode(t)[0])
    for finished, text in walks(backend, tag(layout, TOOLS[1:], "required", False), hf_tokenizer):
        if finished:
            calls = parse_tool_calls(text)[1]
            assert [c["function"]["name"] for c in calls] == ["fb"]


def test_text_markers_and_auto_with_an_answer_schema(backend, hf_tokenizer):
    layout = CallLayout("\n", "\n", "\n")  # a template without tool syntax: Leyline's text form
    constraint = tag(layout, TOOLS, "auto", True, json_grammar(B))
    seen = set()
    for finished, text in walks(backend, constraint, hf_tokenizer, trials=60):
        if not finished:
            continue
        content, calls = parse_tool_calls(text)
        if calls:
            seen.add("calls")
            assert content.strip() == ""
        else:
            seen.add("answer")
            jsonschema.validate(json.loads(text), B)
    assert seen == {"calls", "answer"}
