"""Round three: what the Responses and Messages adapters make of odd input (issue 44, findings 4, 5, 8, 9).

4. ``truncation: "auto"`` on [a large user message, a call, its output] dropped the call with the
   message, leaving the output alone (and losing the reply recognition relies on);
5. five classes of 500 (and a dropped connection): an input item ``id`` that is an object (after
   generation, when the response was stored; streamed, ``response.failed``), ``allowed_tools.tools``
   as a string, a ``namespace`` tool whose ``tools`` is a number, ``exclude_tools`` holding objects
   or a number (``/v1/messages`` and ``count_tokens``), a server tool named outside latin-1 (the
   ``x-leyline-tools-not-offered`` header could not be written) — with CR/LF in it the client got
   no answer at all;
8. a ``context_management`` edit given twice was reported twice; a negative ``keep`` was accepted;
9. user text mentioning ``cache_control`` moved the computed tokens into
   ``cache_creation_input_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx

from tests.attack.helpers import MODEL, serve, service

USER = {"type": "message", "role": "user", "content": "hi"}
CALL = {"type": "function_call", "call_id": "call_9", "name": "read", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_9", "output": "the file says 42"}
ODD_NAME = "séarch€\r\nX-Injected: 1,a"


def responses(**fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": MODEL, "input": [USER], "max_output_tokens": 2, **fields}


def messages(path: str = "/v1/messages", **fields: Any) -> tuple[str, dict[str, Any]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    return path, ({"max_tokens": 2, **body} if path == "/v1/messages" else body)


def clearing(**edit: Any) -> dict[str, Any]:
    return {"edits": [{"type": "clear_tool_uses_20250919", **edit}]}


CASES = {  # name: ((path, body), the param the 400 names)
    "item id an object": (responses(input=[{**USER, "id": {"a": 1}}]), "input.0.id"),
    "item id an object, streamed": (responses(input=[{**USER, "id": [1]}], stream=True), "input.0.id"),
    "allowed_tools.tools a string": (
        responses(
            tools=[{"type": "function", "name": "f"}],
            tool_choice={"type": "allowed_tools", "mode": "auto", "tools": "f"},
        ),
        "tool_choice.tools",
    ),  # fmt: skip
    "namespace tools a number": (responses(tools=[{"type": "namespace", "name": "ns", "tools": 5}]), "tools.0.tools"),
    "exclude_tools objects": (
        messages(context_management=clearing(exclude_tools=[{"name": "f"}])),
        "context_management.edits.0.exclude_tools",
    ),  # fmt: skip
    "exclude_tools a number": (
        messages(context_management=clearing(exclude_tools=5)),
        "context_management.edits.0.exclude_tools",
    ),  # fmt: skip
    "exclude_tools objects, count_tokens": (
        messages("/v1/messages/count_tokens", context_management=clearing(exclude_tools=[{}])),
        "context_management.edits.0.exclude_tools",
    ),  # fmt: skip
    "exclude_tools a number, count_tokens": (
        messages("/v1/messages/count_tokens", context_management=clearing(exclude_tools=5)),
        "context_management.edits.0.exclude_tools",
    ),  # fmt: skip
    "keep negative": (
        messages(context_management=clearing(keep={"type": "tool_uses", "value": -1})),
        "context_management.edits.0.keep",
    ),  # fmt: skip
}


async def _post(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    return await c.post(path, json=body)


def _named(r: httpx.Response, path: str) -> str | None:
    """The field a 4xx names, in the protocol's own error shape."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "code", "message"}, body
        return str(body["error"]["message"]).split(":")[0]
    assert set(body["error"]) == {"type", "code", "message", "param"}, body
    return body["error"]["param"]


async def test_odd_fields_are_4xx_naming_them_never_500(engine):
    with serve(service(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            failures = {}
            for name, ((path, body), param) in CASES.items():
                r = await c.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
                try:
                    assert _named(r, path) == param
                except AssertionError as exc:
                    failures[name] = f"{r.status_code} {r.text[:200]} ({exc})"
            assert not failures, json.dumps(failures, indent=1)
            assert (await c.get("/health")).status_code == 200


async def test_tools_not_offered_are_named_in_a_header_whatever_their_names(engine):
    hosted = [
        {"type": "web_search_€"},
        {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": ODD_NAME}]},
    ]
    server_tool = [{"type": "web_search_20250305", "name": ODD_NAME}]
    with serve(service(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await _post(c, *responses(tools=hosted))
            assert r.status_code == 200, r.text
            assert (
                r.headers["x-leyline-tools-not-offered"]
                == "web_search_%E2%82%AC,ns.s%C3%A9arch%E2%82%AC%0D%0AX-Injected: 1%2Ca"
            )
            assert "x-injected" not in r.headers
            r = await _post(c, *messages(tools=server_tool))
            assert r.status_code == 200, r.text
            assert r.headers["x-leyline-tools-not-offered"] == "s%C3%A9arch%E2%82%AC%0D%0AX-Injected: 1%2Ca"
            assert (await _post(c, *messages("/v1/messages/count_tokens", tools=server_tool))).status_code == 200
            r = await _post(c, *messages(tools=server_tool * 200))
            assert r.status_code == 200 and len(r.headers["x-leyline-tools-not-offered"]) < 1200, r.headers


async def test_truncation_auto_keeps_the_last_exchange_whole(engine):
    large = {"type": "message", "role": "user", "content": "word " * 4500}  # past the 4,096-token context
    with serve(service(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await _post(c, *responses(input=[large, CALL, OUTPUT], truncation="auto"))
            assert r.status_code == 200, r.text
            assert r.headers["x-leyline-truncated-messages"] == "1"  # the message, not the call
            kept = [{"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_9", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_9", "content": "the file says 42"}]  # fmt: skip
            chat = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": kept, "max_tokens": 1})
    assert r.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]


def tool_loop(uses: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "Read every file."}]
    for i in range(uses):
        out.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}}]})
        out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                 "content": f"file {i}: " + "data " * 20}]})  # fmt: skip
    return out


async def test_an_edit_given_twice_is_applied_and_reported_once(engine):
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
            "keep": {"type": "tool_uses", "value": 1}}  # fmt: skip
    with serve(service(engine)) as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as claude:
            answers = [
                await claude.messages.create(model=MODEL, max_tokens=2, messages=tool_loop(5),
                                             extra_body={"context_management": {"edits": edits}})
                for edits in ([edit], [edit, edit])
            ]  # fmt: skip
    once, twice = answers
    applied = once.model_dump()["context_management"]["applied_edits"]
    assert applied[0]["cleared_tool_uses"] == 4
    assert twice.model_dump()["context_management"]["applied_edits"] == applied
    assert prompt_of(twice.usage) == prompt_of(once.usage)


def prompt_of(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)


async def test_text_about_cache_control_is_not_a_breakpoint(engine):
    with serve(service(engine)) as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as claude:
            talk = [{"role": "user", "content": 'What does cache_control do? {"cache_control": 1}'}]
            plain = await claude.messages.create(model=MODEL, max_tokens=2, messages=talk)
            marked = await claude.messages.create(
                model=MODEL, max_tokens=2, messages=talk,
                system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            )  # fmt: skip
    assert plain.usage.cache_creation_input_tokens == 0 and plain.usage.input_tokens > 0, plain.usage
    assert marked.usage.cache_creation_input_tokens and marked.usage.input_tokens == 0, marked.usage
