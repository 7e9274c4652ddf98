"""A Messages API system prompt's volatile lines (Claude Code's attribution line) are dropped, so a
new conversation reuses the last one's cached system prompt, exactly.

Claude Code 2.1.197 opens its system prompt with ``x-anthropic-billing-header: cc_version=…;``
whose suffix depends on the conversation's first prompt. The oracles: the answer is the chat
turn's own greedy answer to the conversation without the line (another key: a fresh prefill), and
the second conversation reuses every token before its own first message, which a server keeping
the line cannot (it shares only the tokens before the line).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-mla"
KEYS = ("sk-vol-a", "sk-vol-b")
SYSTEM = "You are a careful coding agent. " * 40
GREEDY: dict[str, Any] = {"max_tokens": 6, "extra_body": {"temperature": 0}}


def system(suffix: str) -> list[dict[str, Any]]:
    """Claude Code's system blocks: the attribution line, then its prompt."""
    line = f"x-anthropic-billing-header: cc_version=2.1.197.{suffix}; cc_entrypoint=sdk-cli;"
    return [{"type": "text", "text": line}, {"type": "text", "text": SYSTEM}]


def ask(url: str, suffix: str, question: str) -> Any:
    client = anthropic.Anthropic(base_url=url, api_key=KEYS[0], max_retries=0)
    raw = client.messages.with_raw_response.create(
        model=MODEL, system=system(suffix), messages=[{"role": "user", "content": question}], **GREEDY
    )
    return raw.parse(), raw.headers


@pytest.fixture(scope="module")
def default_server() -> Iterator[str]:
    with running_server(make_service(MODEL, kv_budget_mb=64, api_keys=frozenset(KEYS))) as url:
        yield url


def test_the_attribution_line_is_dropped_and_the_next_conversation_reuses_the_system_prompt(default_server):
    first, headers = ask(default_server, "6c5", "Read calc.py and tell me the number.")
    assert headers["x-leyline-volatile-lines-dropped"] == "1"
    second, _ = ask(default_server, "a91", "List the files here.")
    with openai.OpenAI(base_url=default_server + "/v1", api_key=KEYS[1]) as plain:  # the oracle: no line at all
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files here."}]
        oracle = plain.chat.completions.create(model=MODEL, temperature=0, max_tokens=6, messages=messages)
        alone = plain.chat.completions.create(  # the system prompt alone: what every conversation shares
            model=MODEL, temperature=0, max_tokens=1, messages=[{"role": "system", "content": SYSTEM}]
        )
    assert "".join(b.text for b in second.content if b.type == "text") == oracle.choices[0].message.content
    prompt = second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0)
    assert oracle.usage is not None and alone.usage is not None
    assert prompt == oracle.usage.prompt_tokens  # the line is not in the prompt
    shared = alone.usage.prompt_tokens - 2  # (the end of the system turn's framing may differ)
    assert (second.usage.cache_read_input_tokens or 0) >= shared, (second.usage, shared)


def test_an_operator_can_keep_every_line():
    service = make_service(MODEL, kv_budget_mb=64, api_keys=frozenset(KEYS), volatile_system_lines=())
    with running_server(service) as url:
        ask(url, "6c5", "Read calc.py and tell me the number.")
        second, headers = ask(url, "a91", "List the files here.")
    assert "x-leyline-volatile-lines-dropped" not in headers
    assert (second.usage.cache_read_input_tokens or 0) < 40  # only the tokens before the suffix


def test_only_whole_lines_of_system_messages_that_start_with_a_prefix_are_dropped():
    from leyline_server.api.messages_api.blocks import drop_volatile_lines

    messages = [
        {"role": "system", "content": "x-anthropic-billing-header: cc_version=1;"},
        {"role": "system", "content": "keep\nx-anthropic-billing-header: a\nalso keep x-anthropic-billing-header:"},
        {"role": "user", "content": "x-anthropic-billing-header: a user's text stays"},
    ]
    assert drop_volatile_lines(messages, ("x-anthropic-billing-header:",)) == 2
    assert messages == [
        {"role": "system", "content": "keep\nalso keep x-anthropic-billing-header:"},
        {"role": "user", "content": "x-anthropic-billing-header: a user's text stays"},
    ]


def test_the_flag_lists_prefixes_and_an_empty_one_keeps_every_line():
    from leyline_server.cli import volatile_lines

    assert volatile_lines(None) == ("x-anthropic-billing-header:",)
    assert volatile_lines([""]) == ()
    assert volatile_lines(["Date:", "cwd:"]) == ("Date:", "cwd:")
