"""Conversation rule 4 on the real server: a new conversation that differs from a cached one inside a line.

Two conversations of one key share a long system prompt that differs only in its working
directory. Under the opt-in (``X-Leyline-Client-Edits: amortize``) the second opens its session on
the first's cached tokens and splices the path; without it, nothing approximate is served.

The oracle is a fresh server's greedy answer: on a one-layer model a moved row's key and value
depend only on its token and position, so the δ-rotation is exact and the spliced session must
generate what a fresh prefill generates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-gqa"
OPT_IN = {"X-Leyline-Client-Edits": "amortize"}
RULES = "".join(f"Rule {k}: keep file {k} tidy and run test {k * 7} before you answer.\n" for k in range(24))


def system(path: str) -> dict[str, str]:
    return {"role": "system", "content": f"You are a coding agent.\nWorking directory: {path}\n{RULES}"}


def service(engine: str = "embedded") -> Any:
    return make_service(MODEL, layers=1, kv_budget_mb=32, engine=engine)


@pytest.fixture(scope="module")
def fresh() -> Iterator[openai.OpenAI]:
    """A server without sessions: what a fresh prefill of each request generates."""
    with running_server(make_service(MODEL, layers=1, kv_budget_mb=32, prefix_cache=False)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12, extra_headers=headers or {}
    )


@pytest.mark.parametrize("engine", ["embedded", "llamacpp"])
def test_a_second_conversation_reuses_the_first_past_its_path_only_under_the_opt_in(fresh, engine):
    """On llama.cpp the splice moves cells in place: the first conversation's cells must stay its own."""
    with running_server(service(engine)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        first = ask(client, [system("/home/ada/alpha"), {"role": "user", "content": "List the files."}], OPT_IN)
        assert first.leyline["rotated_tokens"] == 0

        plain = [system("/srv/beta-2"), {"role": "user", "content": "Read the README."}]
        without = ask(client, plain)  # no opt-in: exact, the prefix cache alone
        assert without.leyline["sources"] == [] and without.leyline["approximate_tokens"] == 0
        assert without.leyline["rotated_tokens"] == 0
        assert without.leyline["completion_token_ids"] == ask(fresh, plain).leyline["completion_token_ids"]

        second = [system("/tmp/gamma-31"), {"role": "user", "content": "Open the tests."}]
        spliced = ask(client, second, OPT_IN)
        report = spliced.leyline
        assert report["sources"] == ["conversation"]
        assert report["rotated_tokens"] > 300  # the rules moved, not prefilled
        assert report["approximate_tokens"] > 0 and report["fallback"] is None
        assert report["prefilled_tokens"] < 40  # the path and the user's message
        assert report["session_id"] != first.leyline["session_id"]
        assert report["completion_token_ids"] == ask(fresh, second).leyline["completion_token_ids"]

        # the first conversation's session was only read: it continues as before, exactly
        follow = [*first_turn(first), {"role": "user", "content": "And the docs?"}]
        again = ask(client, follow, OPT_IN)
        assert again.leyline["session_id"] == first.leyline["session_id"]
        assert again.leyline["approximate_tokens"] == 0
        assert again.leyline["completion_token_ids"] == ask(fresh, follow).leyline["completion_token_ids"]

        # the spliced conversation continued without the opt-in: a new session, exact KV only
        later = [*second, {"role": "assistant", "content": spliced.choices[0].message.content}]
        later.append({"role": "user", "content": "Thanks."})
        exact = ask(client, later)
        assert exact.leyline["session_id"] != report["session_id"]
        assert exact.leyline["approximate_tokens"] == 0 and exact.leyline["rotated_tokens"] == 0


def first_turn(answer: Any) -> list[dict[str, str]]:
    return [
        system("/home/ada/alpha"),
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": answer.choices[0].message.content},
    ]


def test_another_users_conversation_is_never_reused():
    """The moved rows were computed next to the other conversation's span: a request naming another
    ``user`` (or none, where the cached one named one) gets the exact prefix cache alone."""
    with running_server(service()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        first = [system("/home/ada/alpha"), {"role": "user", "content": "List the files."}]
        client.chat.completions.create(
            model=MODEL, messages=first, temperature=0, max_tokens=4, user="ada", extra_headers=OPT_IN
        )
        for user in ("bob", None):
            second = [system(f"/tmp/{user}-7"), {"role": "user", "content": "Open the tests."}]
            extra = {"user": user} if user else {}
            answer = client.chat.completions.create(
                model=MODEL, messages=second, temperature=0, max_tokens=4, extra_headers=OPT_IN, **extra
            )
            assert answer.leyline["sources"] == [] and answer.leyline["rotated_tokens"] == 0, user
            assert answer.leyline["approximate_tokens"] == 0
        same = [system("/tmp/ada-9"), {"role": "user", "content": "Open the docs."}]
        answer = client.chat.completions.create(
            model=MODEL, messages=same, temperature=0, max_tokens=4, user="ada", extra_headers=OPT_IN
        )
        assert answer.leyline["sources"] == ["conversation"]  # the same user's other conversation


TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def test_a_side_request_without_tools_leaves_the_conversation_where_it_was():
    """Codex's compaction: the history plus a summary prompt, sent without tools; then the tools
    again. The side request gets a session of its own, so the conversation's session still holds
    its base and the next request with tools continues it, reusing all of it."""
    headers = OPT_IN
    with running_server(service()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        opening = [system("/home/ada/alpha"), {"role": "user", "content": "List the files."}]
        first = client.chat.completions.create(
            model=MODEL, messages=opening, tools=[TOOL], temperature=0, max_tokens=8, extra_headers=headers
        )
        history = [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
        summary = [*history, {"role": "user", "content": "Summarize the conversation so far."}]
        side = ask(client, summary, headers)
        assert side.leyline["session_id"] != first.leyline["session_id"]
        assert side.leyline["approximate_tokens"] == 0
        follow = [*history, {"role": "user", "content": "Now read the README."}]
        after = client.chat.completions.create(
            model=MODEL, messages=follow, tools=[TOOL], temperature=0, max_tokens=8, extra_headers=headers
        )
        assert after.leyline["session_id"] == first.leyline["session_id"]
        assert after.leyline["reused_tokens"] >= first.usage.prompt_tokens
