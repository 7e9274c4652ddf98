"""Tool-use prompts of different shapes, and a driver that asks them on each wire protocol.

Shared by ``benchmarks/bench_tool_calls.py`` (the table in ``docs/results/tool_calls.md``) and the
slow-tier test on the real model (``tests/frameworks/test_tool_calls_real_model.py``). Each
:class:`Case` is one user prompt that needs a tool, the tools offered, and ``tool_choice``
(``auto`` or ``required``). :func:`ask` sends it through Chat Completions (openai), the Responses
API (openai) or the Messages API (anthropic), streamed or not, and :func:`judge` scores the answer
with the client's own parsed objects as the oracle:

* **valid** — at least one call, every call names an offered tool, and its arguments are a JSON
  object that validates against that tool's schema (``jsonschema``);
* **framing** — call syntax left in the text the client shows (``<tool_call>``, a fenced or bare
  ``{"name": ..., "arguments": ...}``): must never happen;
* **expected** — the first call names the tool the prompt asks for (reported, not required).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Case", "Answer", "CASES", "PROTOCOLS", "ask", "judge", "framing_in"]

PROTOCOLS = ("chat", "responses", "messages")


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


_S = {"type": "string"}
READ = _fn("read_file", "Read a file and return its content.", {"path": {**_S, "description": "file path"}}, ["path"])
WRITE = _fn("write_file", "Write text to a file, replacing it.", {"path": _S, "content": _S}, ["path", "content"])
SHELL = _fn("run_shell", "Run a shell command and return its output.", {"command": _S}, ["command"])
GREP = _fn(
    "grep", "Search files for a regular expression.", {"pattern": _S, "path": {**_S, "default": "."}}, ["pattern"]
)
LIST = _fn("list_dir", "List the entries of a directory.", {"path": _S}, ["path"])
WEATHER = _fn(
    "get_weather",
    "Current weather for a city.",
    {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city"],
)
STOCK = _fn("get_stock_price", "Latest price of a stock.", {"ticker": _S}, ["ticker"])
EMAIL = _fn("send_email", "Send an email.", {"to": _S, "subject": _S, "body": _S}, ["to", "subject", "body"])
CALC = _fn("calculate", "Evaluate an arithmetic expression exactly.", {"expression": _S}, ["expression"])
EVENT = _fn(
    "create_event",
    "Create a calendar event.",
    {
        "title": _S,
        "time": {
            "type": "object",
            "properties": {"start": _S, "end": _S},
            "required": ["start", "end"],
        },
        "attendees": {
            "type": "array",
            "items": {"type": "object", "properties": {"name": _S, "email": _S}, "required": ["name"]},
        },
    },
    ["title", "time"],
)
ISSUE = _fn(
    "create_issue",
    "Open an issue in the tracker.",
    {
        "title": _S,
        "labels": {"type": "array", "items": _S},
        "assignee": {"type": "object", "properties": {"login": _S}, "required": ["login"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 4},
    },
    ["title", "labels"],
)
CONFIG = _fn(
    "update_config",
    "Change settings in the service configuration.",
    {
        "service": _S,
        "settings": {
            "type": "object",
            "properties": {
                "port": {"type": "integer"},
                "debug": {"type": "boolean"},
                "hosts": {"type": "array", "items": _S},
            },
        },
    },
    ["service", "settings"],
)
TOOLBOX = [READ, WRITE, SHELL, GREP, LIST]
AGENT = "You are a coding agent working in the user's repository. Use the tools to act; do not guess file contents."


@dataclass(frozen=True)
class Case:
    """One prompt that needs a tool: the tools offered, ``tool_choice`` and the tool it should call."""

    name: str
    prompt: str
    tools: tuple[dict[str, Any], ...]
    expected: str
    choice: str = "auto"  # auto | required
    system: str | None = None


CASES: tuple[Case, ...] = (
    # one tool
    Case("one/read", "What does calc.py in this folder return? Read it first.", (READ,), "read_file"),
    Case("one/weather", "What's the weather in Paris right now, in celsius?", (WEATHER,), "get_weather"),
    Case("one/shell", "Run `ls -la` and tell me what is there.", (SHELL,), "run_shell", system=AGENT),
    Case("one/stock", "How much is one NVDA share right now?", (STOCK,), "get_stock_price"),
    Case("one/email", "Email bob@example.com that the build is green, subject 'CI'.", (EMAIL,), "send_email"),
    Case("one/calc", "What is 48213 * 9127 exactly? Use the calculator.", (CALC,), "calculate"),
    Case("one/list", "Which files are in the src directory?", (LIST,), "list_dir", system=AGENT),
    Case("one/read2", "Show me the contents of README.md.", (READ,), "read_file", system=AGENT),
    # several tools
    Case("many/read", "Open setup.cfg and tell me the package version.", tuple(TOOLBOX), "read_file", system=AGENT),
    Case("many/write", "Create a file hello.txt containing 'hi there'.", tuple(TOOLBOX), "write_file", system=AGENT),
    Case("many/shell", "Run the test suite with `pytest -q`.", tuple(TOOLBOX), "run_shell", system=AGENT),
    Case("many/grep", "Find every TODO comment in the code.", tuple(TOOLBOX), "grep", system=AGENT),
    Case("many/list", "List what is in the docs folder.", tuple(TOOLBOX), "list_dir", system=AGENT),
    Case("many/weather", "Is it raining in Tokyo?", (STOCK, WEATHER, EMAIL), "get_weather"),
    Case("many/stock", "Get me the latest AAPL price.", (WEATHER, STOCK, CALC), "get_stock_price"),
    Case("many/calc", "Compute (17 + 25) * 3 - 8 with the calculator.", (EMAIL, CALC, WEATHER), "calculate"),
    # a required call
    Case("required/read", "Check the config.", (READ,), "read_file", choice="required", system=AGENT),
    Case("required/shell", "Is the server running?", (SHELL, READ), "run_shell", choice="required", system=AGENT),
    Case(
        "required/weather", "Should I take an umbrella in London today?", (WEATHER,), "get_weather", choice="required"
    ),
    Case("required/grep", "Where is main() defined?", tuple(TOOLBOX), "grep", choice="required", system=AGENT),
    # nested objects and arrays in the arguments
    Case(
        "nested/event",
        "Book 'Design review' tomorrow 10:00-11:00 with Ana (ana@example.com) and Li.",
        (EVENT,),
        "create_event",
    ),
    Case(
        "nested/issue",
        "Open an issue 'Crash on start' labelled bug and urgent, assigned to octocat, priority 1.",
        (ISSUE,),
        "create_issue",
    ),
    Case(
        "nested/config",
        "Set the api service to port 8080 with debug off, hosts a.local and b.local.",
        (CONFIG, READ),
        "update_config",
    ),
    Case(
        "nested/event2",
        "Put a 'Standup' on the calendar from 9:00 to 9:15 on Monday, no attendees.",
        (EVENT, EMAIL),
        "create_event",
    ),
)


@dataclass
class Answer:
    """What a client parsed out of one answer: its calls (name, arguments text) and the text it shows."""

    calls: list[tuple[str, str]]
    text: str


# Call syntax that must never reach the text a client shows.
_FRAMING = re.compile(r"<tool_call>|</tool_call>|\{\s*\"name\"\s*:\s*\"[^\"]+\"\s*,\s*\"(arguments|parameters)\"")


def framing_in(text: str) -> bool:
    """Whether ``text`` holds tool-call framing (a tag or a ``{"name": ..., "arguments": ...}`` object)."""
    return bool(_FRAMING.search(text))


def _schema(case: Case, name: str) -> dict[str, Any] | None:
    for tool in case.tools:
        if tool["function"]["name"] == name:
            return tool["function"]["parameters"]
    return None


def judge(case: Case, answer: Answer) -> dict[str, bool]:
    """``valid``, ``framing`` and ``expected`` for ``answer`` (see the module docstring)."""
    import jsonschema

    valid = bool(answer.calls)
    for name, arguments in answer.calls:
        schema = _schema(case, name)
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            valid = False
            continue
        if schema is None or not isinstance(parsed, dict):
            valid = False
            continue
        try:
            jsonschema.validate(parsed, schema)
        except jsonschema.ValidationError:
            valid = False
    expected = bool(answer.calls) and answer.calls[0][0] == case.expected
    return {"valid": valid, "framing": framing_in(answer.text), "expected": expected}


def _chat(client: Any, model: str, case: Case, stream: bool, max_tokens: int) -> Answer:
    messages = ([{"role": "system", "content": case.system}] if case.system else []) + [
        {"role": "user", "content": case.prompt}
    ]
    kwargs = {"model": model, "messages": messages, "tools": list(case.tools), "tool_choice": case.choice}
    kwargs |= {"temperature": 0, "max_tokens": max_tokens}
    if not stream:
        msg = client.chat.completions.create(**kwargs).choices[0].message
        return Answer([(c.function.name, c.function.arguments) for c in msg.tool_calls or []], msg.content or "")
    text, calls = "", {}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                name, args = calls.get(c.index, ("", ""))
                calls[c.index] = (name + (c.function.name or ""), args + (c.function.arguments or ""))
    return Answer([calls[i] for i in sorted(calls)], text)


def _responses(client: Any, model: str, case: Case, stream: bool, max_tokens: int) -> Answer:
    tools = [{"type": "function", **t["function"]} for t in case.tools]
    kwargs: dict[str, Any] = {"model": model, "input": case.prompt, "tools": tools, "tool_choice": case.choice}
    kwargs |= {"temperature": 0, "max_output_tokens": max_tokens, "store": False}
    if case.system:
        kwargs["instructions"] = case.system
    if not stream:
        response = client.responses.create(**kwargs)
        text = response.output_text
    else:
        text, response = "", None
        for event in client.responses.create(**kwargs, stream=True):
            if event.type == "response.output_text.delta":
                text += event.delta
            elif event.type == "response.completed":
                response = event.response
        assert response is not None, "the stream ended without response.completed"
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    return Answer(calls, text)


def _messages(client: Any, model: str, case: Case, stream: bool, max_tokens: int) -> Answer:
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in case.tools
    ]
    choice = {"type": "any" if case.choice == "required" else "auto"}
    kwargs: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": case.prompt}]}
    # greedy: anthropic's client no longer takes ``temperature`` as an argument, the API still does
    kwargs |= {"tools": tools, "tool_choice": choice, "max_tokens": max_tokens, "extra_body": {"temperature": 0}}
    if case.system:
        kwargs["system"] = case.system
    if not stream:
        message = client.messages.create(**kwargs)
        text = "".join(b.text for b in message.content if b.type == "text")
    else:
        text = ""
        with client.messages.stream(**kwargs) as events:
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text += event.delta.text
            message = events.get_final_message()
    calls = [(b.name, json.dumps(b.input)) for b in message.content if b.type == "tool_use"]
    return Answer(calls, text)


def ask(clients: dict[str, Any], protocol: str, model: str, case: Case, stream: bool, max_tokens: int = 256) -> Answer:
    """``case`` through ``protocol`` (``clients``: ``openai`` and ``anthropic`` clients of one server)."""
    if protocol == "chat":
        return _chat(clients["openai"], model, case, stream, max_tokens)
    if protocol == "responses":
        return _responses(clients["openai"], model, case, stream, max_tokens)
    if protocol == "messages":
        return _messages(clients["anthropic"], model, case, stream, max_tokens)
    raise ValueError(f"unknown protocol {protocol!r}")
