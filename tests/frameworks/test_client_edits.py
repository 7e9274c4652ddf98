"""The edits agents make themselves, spliced: a conversation recognised after its client edited it.

Three ways agents edit their own history, each through a plain client with the opt-in header
(``X-Leyline-Client-Edits: amortize``) and through ``AsyncLeyline`` without policies:

* Claude Code's microcompact: old tool results replaced in place by ``[Old tool result content
  cleared]``;
* LangChain's ``trim_messages``: the oldest exchanges dropped;
* openai-agents' ``ToolOutputTrimmer``: older tool outputs cut to a preview.

The oracle is the server's own report of every request (the ``leyline`` field, or the
``x-leyline-*`` headers a plain client gets): one session per conversation, ``rotated_tokens > 0``
on every turn whose edit kept later content, no fallback. The agent's replies are the server's own
(forced calls of a tool without arguments, so the random tiny model answers in a few tokens):
that is what recognises the conversation after the edit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from leyline_sdk import AsyncLeyline
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
OPT_IN = {"X-Leyline-Client-Edits": "amortize"}
PLACEHOLDER = "[Old tool result content cleared]"
TOOL = {
    "type": "function",
    "function": {
        "name": "read_next",
        "description": "Read the next file of the project.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "strict": True,
    },
}


def file_text(i: int) -> str:
    """A ~300-token tool output."""
    return f"# file {i}\n" + "".join(f"value_{i}_{k} = {k * k}\n" for k in range(40))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A real server without ``--auto-splice``: only the opt-in header (or the SDK) brings sessions."""
    with running_server(make_service(MODEL, kv_budget_mb=64)) as url:
        yield url + "/v1"


class Recorder:
    """httpx event hooks that keep every chat request's messages and its response's ``x-leyline-*`` headers."""

    def __init__(self) -> None:
        self.reports: list[dict[str, str]] = []
        self.sent: list[list[dict[str, Any]]] = []

    async def request(self, request: Any) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.sent.append(json.loads(request.content)["messages"])

    async def response(self, response: Any) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            self.reports.append({k: v for k, v in response.headers.items() if k.startswith("x-leyline-")})

    def edited(self) -> list[int]:
        """The turns (from 1) whose messages do not extend the previous request's: the agent edited them."""
        return [i + 1 for i in range(1, len(self.sent)) if self.sent[i][: len(self.sent[i - 1])] != self.sent[i - 1]]


def plain_client(server: str, recorder: Recorder, headers: dict[str, str] | None = None) -> openai.AsyncOpenAI:
    hooks = {"request": [recorder.request], "response": [recorder.response]}
    http = openai.DefaultAsyncHttpxClient(event_hooks=hooks)
    return openai.AsyncOpenAI(base_url=server, api_key="x", default_headers=headers or {}, http_client=http)


def recording_leyline(server: str, recorder: Recorder) -> AsyncLeyline:
    hooks = {"request": [recorder.request], "response": [recorder.response]}
    return AsyncLeyline(base_url=server, api_key="x", http_client=openai.DefaultAsyncHttpxClient(event_hooks=hooks))


async def microcompact_loop(client: openai.AsyncOpenAI, turns: int = 6) -> list[Any]:
    """A tool loop; turn 4 clears the oldest tool result, turn 5 the second (Claude Code's microcompact)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Read every file of the project."},
        {"role": "user", "content": "Summarise the project."},
    ]
    answers = []
    for turn in range(1, turns + 1):
        if turn in (4, 5):
            results = [m for m in messages if m["role"] == "tool" and m["content"] != PLACEHOLDER]
            results[0]["content"] = PLACEHOLDER
        r = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[TOOL], tool_choice="required", max_tokens=64, temperature=0
        )
        answers.append(r)
        message = r.choices[0].message.model_dump(exclude_none=True)
        messages += [
            message,
            {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": file_text(turn)},
        ]
    return answers


def check_one_spliced_session(reports: list[dict[str, Any]], edited: list[int]) -> None:
    """One session throughout; every edited turn rotated (later content kept), none fell back."""
    sessions = {r["session"] for r in reports}
    assert len(sessions) == 1, sessions
    assert all(r.get("fallback") is None for r in reports), reports
    for turn in edited:
        assert int(reports[turn - 1]["rotated"]) > 0, (turn, reports[turn - 1])


def header_reports(recorder: Recorder) -> list[dict[str, Any]]:
    return [
        {
            "session": h.get("x-leyline-session"),
            "rotated": h.get("x-leyline-rotated-tokens", "0"),
            "fallback": h.get("x-leyline-fallback"),
            "approximate": int(h.get("x-leyline-approximate-tokens", "0")),
        }
        for h in recorder.reports
    ]


def stats_reports(client: AsyncLeyline) -> list[dict[str, Any]]:
    (session,) = client.sessions
    return [
        {
            "session": session.session_id,
            "rotated": s.rotated_tokens,
            "fallback": s.fallback,
            "client": s.client_directives,
        }
        for s in session.stats
    ]


async def test_microcompact_through_a_plain_client_with_the_opt_in_header(server):
    recorder = Recorder()
    client = plain_client(server, recorder, OPT_IN)
    await microcompact_loop(client)
    reports = header_reports(recorder)
    check_one_spliced_session(reports, edited=[4, 5])
    assert all(r["approximate"] > 0 for r in reports[3:])  # it asked for amortize: approximate from turn 4 on
    await client.close()


async def test_microcompact_through_async_leyline_without_policies(server):
    client = AsyncLeyline(base_url=server, api_key="x")
    await microcompact_loop(client)
    reports = stats_reports(client)
    check_one_spliced_session(reports, edited=[4, 5])
    assert all(reports[t - 1]["client"] > 0 for t in (4, 5))  # the agent's own edits, said so
    await client.close()


async def test_microcompact_without_the_opt_in_stays_exact_in_one_session():
    recorder = Recorder()
    with running_server(make_service(MODEL, kv_budget_mb=64, auto_splice=True)) as url:
        client = plain_client(url + "/v1", recorder)
        spliced = await microcompact_loop(client)
        await client.close()
    reports = header_reports(recorder)
    assert len({r["session"] for r in reports}) == 1  # recognised after each edit
    assert all(int(r["rotated"]) == 0 and r["approximate"] == 0 for r in reports)  # exact: recomputed from the edit
    recorder = Recorder()
    with running_server(make_service(MODEL, kv_budget_mb=64)) as url:  # a fresh server, no sessions: the oracle
        client = plain_client(url + "/v1", recorder)
        fresh = await microcompact_loop(client)
        await client.close()
    assert [r.choices[0].message.tool_calls[0].function.name for r in spliced] == [
        r.choices[0].message.tool_calls[0].function.name for r in fresh
    ]
    assert [r.usage.completion_tokens for r in spliced] == [r.usage.completion_tokens for r in fresh]


async def trimmed_loop(llm: Any, turns: int = 6) -> None:
    """Each turn a new question, a forced tool call and its result; LangChain's ``trim_messages``
    keeps the system prompt and the last two exchanges (an exchange is dropped from turn 4 on)."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage, trim_messages

    history: list[Any] = [SystemMessage("You are a coding agent. Read every file of the project.")]
    for turn in range(1, turns + 1):
        history.append(HumanMessage(f"Question {turn}: what does file {turn} hold?"))
        window = trim_messages(
            history, max_tokens=7, token_counter=len, strategy="last", start_on="human", include_system=True
        )
        reply = await llm.ainvoke(window)
        history += [reply, ToolMessage(file_text(turn), tool_call_id=reply.tool_calls[0]["id"])]


def chat_openai(**kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, temperature=0, max_tokens=64, **kwargs)
    return llm.bind_tools([TOOL], tool_choice="read_next")


async def test_langchain_trim_messages_through_a_plain_client_with_the_opt_in_header(server):
    recorder = Recorder()
    client = plain_client(server, recorder, OPT_IN)
    await trimmed_loop(chat_openai(api_key="x", root_async_client=client, async_client=client.chat.completions))
    assert recorder.edited() == [3, 4, 5, 6]  # trim_messages drops an exchange from turn 3 on
    check_one_spliced_session(header_reports(recorder), edited=recorder.edited())
    await client.close()


async def test_langchain_trim_messages_through_async_leyline_without_policies(server):
    recorder = Recorder()
    client = recording_leyline(server, recorder)
    await trimmed_loop(chat_openai(api_key="x", root_async_client=client, async_client=client.chat.completions))
    reports = stats_reports(client)
    assert recorder.edited() == [3, 4, 5, 6]
    check_one_spliced_session(reports, edited=recorder.edited())
    assert all(reports[t - 1]["client"] > 0 for t in recorder.edited())
    await client.close()


async def agents_loop(client: openai.AsyncOpenAI, turns: int = 4) -> None:
    """openai-agents with its ``ToolOutputTrimmer`` as the run's input filter: each run calls the
    tool once (forced, then ``tool_choice`` resets) and answers; in the next run that output is
    older than the last user message and is cut to a preview: an edit of what the model saw."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.extensions import ToolOutputTrimmer

    set_tracing_disabled(True)

    @function_tool
    def read_next() -> str:
        """Read the next file of the project."""
        return file_text(len(items))

    agent = Agent(
        name="reader",
        instructions="You are a coding agent. Read every file of the project.",
        tools=[read_next],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=64, temperature=0),
    )
    trimmer = ToolOutputTrimmer(recent_turns=1, max_output_chars=200, preview_chars=40)
    items: list[Any] = []
    for turn in range(1, turns + 1):
        items = [*items, {"role": "user", "content": f"Question {turn}: read the next file."}]
        result = await Runner.run(agent, items, max_turns=3, run_config=RunConfig(call_model_input_filter=trimmer))
        items = result.to_input_list()


async def test_openai_agents_tool_output_trimmer_through_a_plain_client_with_the_opt_in_header(server):
    recorder = Recorder()
    client = plain_client(server, recorder, OPT_IN)
    await agents_loop(client)
    assert recorder.edited() == [3, 5, 7]  # each run's first request trims the previous run's output
    check_one_spliced_session(header_reports(recorder), edited=recorder.edited())
    await client.close()


async def test_openai_agents_tool_output_trimmer_through_async_leyline_without_policies(server):
    recorder = Recorder()
    client = recording_leyline(server, recorder)
    await agents_loop(client)
    reports = stats_reports(client)
    assert recorder.edited() == [3, 5, 7]
    check_one_spliced_session(reports, edited=recorder.edited())
    await client.close()
