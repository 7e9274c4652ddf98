"""The Responses and Messages request bodies as their own APIs define them, for the schema fuzzer.

The server's ``/openapi.json`` types most of these fields ``Any`` (the adapters read them item by
item), so schemathesis would generate little but ``{}`` there. :func:`detailed` replaces them with
schemas of what OpenAI's and Anthropic's clients send — input items, content blocks, tools,
``tool_choice``, ``context_management``, formats — plus the odd values a careless client sends
(an ``id`` that is an object, names outside latin-1, CR/LF), so that positive and negative
generation both reach the adapters' per-item code.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["detailed"]

ODD = {"enum": ["", "x", "séarch€", "a\r\nb", "leyline.v1:aGk=", "leyline.v1:!!", "name,with,commas"]}
TEXT = {"anyOf": [{"type": "string", "maxLength": 40}, ODD]}
NAME = {"anyOf": [{"type": "string", "pattern": "^[a-z_]{1,8}$"}, ODD]}
SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"enum": ["object", "string", "array"]},
        "properties": {"type": "object", "maxProperties": 3, "additionalProperties": {"type": "object"}},
        "required": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
}
ANY_ID = {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "object", "maxProperties": 1}, {"type": "integer"}]}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _list(item: dict[str, Any], most: int = 4) -> dict[str, Any]:
    return {"type": "array", "items": item, "maxItems": most}


# -- OpenAI's Responses API ------------------------------------------------------------------------
PART = _object(["type"], type={"enum": ["input_text", "output_text", "text", "refusal", "input_image"]},
               text=TEXT)  # fmt: skip
RESPONSE_ITEM = {
    "anyOf": [
        _object(
            ["role", "content", "id"],
            type={"const": "message"},
            role={"enum": ["user", "assistant", "system", "developer", "tool"]},
            content={"anyOf": [TEXT, _list(PART, 3)]},
            id=ANY_ID,
        ),  # fmt: skip
        _object(
            ["type", "call_id", "name", "arguments", "id"],
            type={"const": "function_call"},
            call_id=NAME,
            name=NAME,
            arguments={"enum": ["{}", '{"a": 1}', "not json"]},
            namespace=NAME,
            id=ANY_ID,
        ),  # fmt: skip
        _object(
            ["type", "call_id", "output"],
            type={"const": "function_call_output"},
            call_id=NAME,
            output={"anyOf": [TEXT, _list(PART, 2)]},
        ),  # fmt: skip
        _object(
            ["type", "id", "encrypted_content"],
            type={"const": "reasoning"},
            id=ANY_ID,
            summary=_list({"type": "object"}, 1),
            encrypted_content=TEXT,
        ),  # fmt: skip
        _object(["type", "id"], type={"const": "item_reference"}, id=ANY_ID),
        _object(["type"], type={"enum": ["web_search_call", "compaction", "custom_tool_call"]}),
    ]
}
FUNCTION = _object(["type", "name"], type={"const": "function"}, name=NAME, parameters=SMALL_SCHEMA,
                   strict={"type": "boolean"}, description=TEXT)  # fmt: skip
RESPONSE_TOOL = {
    "anyOf": [
        FUNCTION,
        _object(["type", "name", "tools"], type={"const": "namespace"}, name=NAME,
                tools={"anyOf": [_list({"anyOf": [FUNCTION, _object(["type", "name"], type={"const": "custom"},
                                                                      name=NAME)]}, 3), {"type": "integer"}]}),
        _object(["type"], type={"anyOf": [{"enum": ["web_search", "file_search", "code_interpreter", "mcp"]}, ODD]}),
    ]
}  # fmt: skip
RESPONSE_CHOICE = {
    "anyOf": [
        {"enum": ["auto", "none", "required"]},
        _object(["type", "name"], type={"const": "function"}, name=NAME),
        _object(
            ["type", "mode", "tools"],
            type={"const": "allowed_tools"},
            mode={"enum": ["auto", "required"]},
            tools={
                "anyOf": [
                    _list(_object(["type", "name"], type={"const": "function"}, name=NAME), 2),
                    {"type": "string"},
                ]
            },
        ),  # fmt: skip
        _object(["type"], type={"enum": ["web_search", "file_search"]}),
    ]
}
RESPONSES = {
    "input": {"anyOf": [TEXT, _list(RESPONSE_ITEM, 6)]},
    "instructions": TEXT,
    "tools": _list(RESPONSE_TOOL, 3),
    "tool_choice": RESPONSE_CHOICE,
    "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
    "text": _object(["format"], format=_object(["type"], type={"enum": ["text", "json_object", "json_schema"]},
                                               name=NAME, schema=SMALL_SCHEMA, strict={"type": "boolean"})),
    "reasoning": _object([], effort={"enum": ["low", "medium", "high"]}, summary={"enum": ["auto", "concise"]}),
    "truncation": {"enum": ["auto", "disabled"]},
    "include": _list({"enum": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, 2),
    "metadata": {"type": "object", "maxProperties": 3, "additionalProperties": TEXT},
    "user": TEXT,
    "safety_identifier": TEXT,
    "prompt_cache_key": TEXT,
    "previous_response_id": TEXT,
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 3},
}  # fmt: skip

# -- Anthropic's Messages API ----------------------------------------------------------------------
CACHE = _object(["type"], type={"const": "ephemeral"})
TEXT_BLOCK = _object(["type", "text"], type={"const": "text"}, text=TEXT, cache_control=CACHE)
BLOCK = {
    "anyOf": [
        TEXT_BLOCK,
        _object(["type", "id", "name", "input"], type={"const": "tool_use"}, id=NAME, name=NAME,
                input={"type": "object", "maxProperties": 2}),  # fmt: skip
        _object(["type", "tool_use_id"], type={"const": "tool_result"}, tool_use_id=NAME,
                content={"anyOf": [TEXT, _list(TEXT_BLOCK, 2)]}, is_error={"type": "boolean"}, cache_control=CACHE),
        _object(["type", "thinking"], type={"const": "thinking"}, thinking=TEXT, signature=TEXT),
        _object(["type", "data"], type={"const": "redacted_thinking"}, data=TEXT),
        _object(["type"], type={"enum": ["image", "document"]}),
    ]
}  # fmt: skip
MESSAGE = _object(["role", "content"], role={"enum": ["user", "assistant", "system"]},
                  content={"anyOf": [TEXT, _list(BLOCK, 4)]})  # fmt: skip
MESSAGE_TOOL = {
    "anyOf": [
        _object(
            ["name", "input_schema"],
            name=NAME,
            description=TEXT,
            input_schema=SMALL_SCHEMA,
            strict={"type": "boolean"},
            cache_control=CACHE,
        ),  # fmt: skip
        _object(["type", "name"], type={"enum": ["web_search_20250305", "bash_20250124"]}, name=NAME),
    ]
}
NAMES = {"anyOf": [_list(NAME, 2), _list({"type": "object"}, 2), {"type": "integer"}, {"type": "boolean"}]}
COUNT = {"type": "integer", "minimum": -2, "maximum": 6}
EDIT = {
    "anyOf": [
        _object(["type", "keep", "exclude_tools"], type={"const": "clear_tool_uses_20250919"},
                trigger=_object(["type", "value"], type={"enum": ["tool_uses", "input_tokens"]}, value=COUNT),
                keep=_object(["type", "value"], type={"const": "tool_uses"}, value=COUNT),
                exclude_tools=NAMES, clear_tool_inputs=NAMES,
                clear_at_least=_object(["type", "value"], type={"const": "input_tokens"}, value=COUNT)),
        _object(["type"], type={"const": "clear_thinking_20251015"},
                keep={"anyOf": [{"const": "all"}, _object(["type", "value"], type={"const": "thinking_turns"},
                                                          value=COUNT)]}),
        _object(["type"], type={"enum": ["compact"]}),
    ]
}  # fmt: skip
MESSAGES = {
    "messages": _list(MESSAGE, 6),
    "system": {"anyOf": [TEXT, _list(TEXT_BLOCK, 2)]},
    "tools": _list(MESSAGE_TOOL, 3),
    "tool_choice": _object(["type"], type={"enum": ["auto", "any", "tool", "none"]}, name=NAME,
                           disable_parallel_tool_use={"type": "boolean"}),  # fmt: skip
    "context_management": _object([], edits=_list(EDIT, 3)),
    "thinking": _object(["type"], type={"enum": ["enabled", "disabled", "adaptive"]}, budget_tokens=COUNT),
    "output_config": _object([], effort={"enum": ["low", "high"]},
                             format=_object(["type"], type={"enum": ["json_schema"]}, schema=SMALL_SCHEMA)),
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
    "metadata": _object([], user_id=TEXT),
    "stop_sequences": _list(TEXT, 2),
}  # fmt: skip


# fields the server refuses unless they hold their default (null): a valid request leaves them out
REFUSED = ("background", "background_options", "image", "conversation", "prompt", "container", "mcp_servers",
           "compaction")  # fmt: skip
BODIES = (("ResponsesRequest", RESPONSES, "input"), ("MessagesRequest", MESSAGES, "messages"),
          ("CountTokensRequest", MESSAGES, "messages"))  # fmt: skip


def detailed(openapi: dict[str, Any], model: str) -> dict[str, Any]:
    """``openapi`` (the server's own schema) with the Responses and Messages request bodies detailed
    (``model``: the served model, the one valid value of ``model``)."""
    out = copy.deepcopy(openapi)
    schemas = out["components"]["schemas"]
    for name, fields, needed in BODIES:
        body = schemas[name]
        properties = body["properties"]
        properties.update({k: v for k, v in fields.items() if k in properties})
        properties.update({k: {"type": "null"} for k in REFUSED if k in properties})
        properties["model"] = {"const": model}
        if name == "ResponsesRequest":
            properties["context_management"] = {"type": "null"}  # refused there, honoured by Messages
        body["required"] = sorted({*body.get("required", ()), needed})
    return out
