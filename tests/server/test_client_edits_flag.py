"""``--client-edits`` (and its older spelling ``--splice-client-edits``): the server's default for
the edits plain clients make to their own history, which ``X-Leyline-Client-Edits`` overrides.

Real servers on loopback, built from the CLI's own parser, driven by the openai client. A client
clears an old tool output (the eviction the splice is for): spliced in place (``rotated_tokens``
> 0, approximate KV) only where the operator or the request asked for ``amortize``; otherwise the
answer is a server without sessions' (the oracle for exact).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from leyline_server.cli import build_service, parse_args
from leyline_server.local import serve_in_thread

BASE = ["--model-path", "tiny-gqa", "--preset-layers", "2", "--kv-budget-mb", "16", "--context-length", "2048"]
OUTPUT = "".join(f"line {i}: value_{i} = {i * i}\n" for i in range(40))


def opening(output: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "user", "content": "What is in it?"},
    ]  # fmt: skip


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
    r = client.chat.completions.create(
        model="tiny-gqa", messages=messages, max_tokens=4, temperature=0, extra_headers=headers or {}
    )
    return r, r.leyline


def cleared_turn(argv: list[str], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The second turn's ``leyline`` report after the client cleared the first turn's tool output."""
    service = build_service(parse_args([*BASE, *argv]))
    with serve_in_thread(service) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        first, _ = ask(client, opening(OUTPUT), headers)
        reply = {"role": "assistant", "content": first.choices[0].message.content}
        _, report = ask(client, [*opening("[cleared]"), reply, {"role": "user", "content": "And then?"}], headers)
    return report


def test_the_flag_parses_to_one_setting():
    assert parse_args([]).client_edits == "exact"
    assert parse_args(["--client-edits", "amortize"]).client_edits == "amortize"
    assert parse_args(["--splice-client-edits"]).client_edits == "amortize"
    assert build_service(parse_args([*BASE, "--splice-client-edits"])).config.client_edits == "amortize"
    with pytest.raises(SystemExit):
        parse_args(["--client-edits", "splice"])


@pytest.mark.parametrize("argv", [["--client-edits", "amortize"], ["--splice-client-edits"]], ids=" ".join)
def test_amortize_on_the_server_splices_a_plain_clients_edit(argv):
    report = cleared_turn(argv)
    assert report["rotated_tokens"] > 0 and report["approximate_tokens"] > 0, report
    assert report["client_directives"] >= 1 and "client" in report["sources"], report


def test_exact_by_default_and_when_the_request_says_so():
    oracle = cleared_turn([])  # no flag: no conversation sessions, the exact prefix cache alone
    said = cleared_turn(["--client-edits", "amortize"], {"X-Leyline-Client-Edits": "exact"})
    for report in (oracle, said):
        assert report["approximate_tokens"] == 0 and report["rotated_tokens"] == 0, report
    assert said["completion_token_ids"] == oracle["completion_token_ids"]
