"""Conversation identity on the server: a request continues only its own conversation's session.

Plain clients (no ``leyline`` field) on a server with ``--auto-splice``. The oracle for "exact" is
a fresh server without sessions: the same request there must generate the same tokens
(``completion_token_ids``, temperature 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
OPT_IN = {"X-Leyline-Client-Edits": "amortize"}
PLACEHOLDER = "[Old tool result content cleared]"
SYSTEM = {"role": "system", "content": "You are a coding agent. Read every file of the project."}
TOOL = {
    "type": "function",
    "function": {
        "name": "read_next",
        "description": "Read the next file.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}

pytestmark = pytest.mark.slow


def file_text(conv: int, turn: int) -> str:
    return f"# conversation {conv}, file {turn}\n" + "".join(f"v{conv}_{turn}_{k} = {k * k}\n" for k in range(30))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server(make_service(MODEL, kv_budget_mb=96, auto_splice=True)) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def fresh() -> Iterator[openai.OpenAI]:
    """A server without sessions: what a fresh prefill of each request generates."""
    with running_server(make_service(MODEL, kv_budget_mb=96)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    if "tools" in kwargs:
        kwargs.setdefault("max_tokens", 48)  # a forced call of a tool without arguments
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **{"max_tokens": 12, **kwargs})


def test_two_conversations_that_open_alike_never_continue_each_other(server, fresh):
    """The swap: A and B open with the same request; B's session must not serve A's next turn."""
    client = openai.OpenAI(base_url=server, api_key="x", max_retries=0)
    opening = [SYSTEM, {"role": "user", "content": "Say something."}]
    a1 = client.chat.completions.create(model=MODEL, messages=opening, max_tokens=12, temperature=1.0, seed=1)
    b1 = client.chat.completions.create(model=MODEL, messages=opening, max_tokens=12, temperature=1.0, seed=2)
    assert a1.choices[0].message.content != b1.choices[0].message.content  # two different replies
    assert a1.leyline["session_id"] != b1.leyline["session_id"]
    follow = [
        *opening,
        {"role": "assistant", "content": a1.choices[0].message.content},
        {"role": "user", "content": "More."},
    ]
    a2 = ask(client, follow)
    assert a2.leyline["session_id"] == a1.leyline["session_id"]  # A continues A's session, not B's (the later one)
    assert a2.leyline["approximate_tokens"] == 0 and a2.leyline["rotated_tokens"] == 0
    assert a2.leyline["completion_token_ids"] == ask(fresh, follow).leyline["completion_token_ids"]


def test_a_reply_two_sessions_share_continues_neither(server):
    """Identical openings answered alike (greedy): the next request is equally likely theirs: a new session."""
    client = openai.OpenAI(base_url=server, api_key="x", max_retries=0)
    opening = [SYSTEM, {"role": "user", "content": "Say the same thing twice."}]
    first, second = ask(client, opening), ask(client, opening)
    assert first.choices[0].message.content == second.choices[0].message.content
    follow = [
        *opening,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Go on."},
    ]
    third = ask(client, follow)
    assert third.leyline["session_id"] not in (first.leyline["session_id"], second.leyline["session_id"])
    named = [*follow[:-1], {"role": "user", "content": "Go on, named."}]
    hinted = [ask(client, opening, prompt_cache_key=f"conv-{i}") for i in range(2)]
    reply = {"role": "assistant", "content": hinted[0].choices[0].message.content}
    fourth = ask(client, [*opening, reply, named[-1]], prompt_cache_key="conv-1")
    assert fourth.leyline["session_id"] == hinted[1].leyline["session_id"]  # the hint tells them apart


def test_an_older_reply_is_a_fork_with_a_session_of_its_own(server):
    client = openai.OpenAI(base_url=server, api_key="x", max_retries=0)
    messages = [SYSTEM, {"role": "user", "content": "Fork me."}]
    first = ask(client, messages, tools=[TOOL], tool_choice="required")
    reply = first.choices[0].message.model_dump(exclude_none=True)
    turn = [*messages, reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a = 1\n"}]
    second = ask(client, turn, tools=[TOOL], tool_choice="required")
    assert second.leyline["session_id"] == first.leyline["session_id"]
    other = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "b = 2\n"}
    forked = ask(client, [*turn[:-1], other], tools=[TOOL], tool_choice="required")  # the first reply, not the latest
    assert forked.leyline["session_id"] != first.leyline["session_id"]  # the session moved on: a new one
    assert forked.leyline["approximate_tokens"] == 0


def conversation_turn(client: openai.OpenAI, state: dict[str, Any], conv: int, turn: int) -> Any:
    """One turn of conversation ``conv``: at its edit turn, its oldest tool result is cleared first."""
    messages = state["messages"]
    if turn == state["edit_at"]:
        oldest = next(m for m in messages if m["role"] == "tool")
        oldest["content"] = PLACEHOLDER
    r = ask(client, messages, tools=[TOOL], tool_choice="required")
    state["sent"].append([dict(m) for m in messages])
    reply = r.choices[0].message.model_dump(exclude_none=True)
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": file_text(conv, turn)}
    messages += [reply, tool]
    return r


def test_eight_interleaved_conversations_each_keep_their_own_session(server, fresh):
    """One key, identical openings, edited at different turns, half of them opted in."""
    clients = [
        openai.OpenAI(base_url=server, api_key="x", max_retries=0, default_headers=OPT_IN if c % 2 else {})
        for c in range(8)
    ]
    states = [
        {"messages": [SYSTEM, {"role": "user", "content": "Read the project."}], "edit_at": 3 + c % 3, "sent": []}
        for c in range(8)
    ]
    answers: list[list[Any]] = [[] for _ in range(8)]
    for turn in range(1, 7):
        for c in range(8):  # interleaved: every conversation's turn before the next turn of any
            answers[c].append(conversation_turn(clients[c], states[c], c, turn))
    sessions = [{a.leyline["session_id"] for a in conv} for conv in answers]
    assert all(len(s) == 1 for s in sessions), sessions  # each on one session throughout
    assert len(set.union(*sessions)) == 8  # ... and no two on the same one
    served_approximate = []
    for c in range(8):
        edit = states[c]["edit_at"]
        report = answers[c][edit - 1].leyline
        assert report["fallback"] is None and report["client_directives"] > 0, (c, report)
        if c % 2:  # opted in: the cleared result spliced, approximate KV from there on (only for it)
            assert report["rotated_tokens"] > 0, (c, report)
            assert all(a.leyline["approximate_tokens"] == 0 for a in answers[c][: edit - 1])
            served_approximate.append(any(a.leyline["approximate_tokens"] > 0 for a in answers[c][edit - 1 :]))
        else:  # exact: every answer is a fresh server's
            assert all(a.leyline["approximate_tokens"] == 0 and a.leyline["rotated_tokens"] == 0 for a in answers[c])
            for sent, answer in zip(states[c]["sent"], answers[c], strict=True):
                oracle = ask(fresh, sent, tools=[TOOL], tool_choice="required")
                assert answer.leyline["completion_token_ids"] == oracle.leyline["completion_token_ids"]
    # The spliced paths served their own sessions. Not every one of them: where an exact path of the
    # same tokens exists (conversation 3 clears at the turn conversation 0 recomputed the same clearing
    # exactly), the longer exact match is served instead, which is never worse.
    assert sum(served_approximate) >= 2, served_approximate
