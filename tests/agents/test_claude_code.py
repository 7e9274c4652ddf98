"""Claude Code (``@anthropic-ai/claude-code``, pinned) on Leyline's Messages API, offline.

The tiny long-context preset on the llama.cpp engine holds Claude Code's first request (~46k
tokens of the tiny tokenizer: its system prompt and 24 tools); its ``max_tokens: 32000`` is
capped to the room left. The model is random but its sampled replies end within a few tokens:
``claude -p`` must exit 0 printing the model's answer (the text of the last message the server
sent), with every request it made answered (the server's own request counter, by route and
status).
"""

from __future__ import annotations

import difflib
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agents.clients import RefusingProxy, claude
from tests.agents.recording import messages_answered
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-gqa-long"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    service = make_service(MODEL, engine="llamacpp", kv_budget_mb=512, max_context_tokens=65536)
    with messages_answered() as answers, running_server(service) as url:
        yield url, answers


def statuses(url: str) -> dict[tuple[str, str], float]:
    """The server's request counter: (route, status) -> count."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    pattern = re.compile(r'^leyline_requests_total\{route="([^"]+)",status="(\d+)"\} (\S+)$', re.M)
    return {(route, status): float(n) for route, status, n in pattern.findall(text)}


def test_claude_p_answers_with_the_models_reply(served, proxy: RefusingProxy, tmp_path):
    url, answers = served
    run = claude(tmp_path, url, MODEL, "Say hello.", proxy, max_output=64)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert answers, "no message was answered"
    prompts = [sum(v for k, v in a["usage"].items() if k.endswith("input_tokens")) for a in answers]
    assert max(prompts) > 30_000, prompts  # its whole first turn (system prompt, tools) was served
    last = "".join(b.get("text", "") for b in answers[-1]["content"] if b["type"] == "text")
    assert run.stdout.strip() == last.strip(), (run.stdout, last)
    print(f"claude -p printed {run.stdout.strip()!r}; prompts {prompts}")
    counted = statuses(url)
    messages = {status: n for (route, status), n in counted.items() if route.startswith("/v1/messages")}
    assert messages and set(messages) == {"200"}, counted  # every request it made: answered
    assert proxy.attempts == [], proxy.attempts  # nothing tried to leave but through the refusing proxy


def recording_prompts() -> tuple[Any, list[list[int]]]:
    """A service on the tiny long-context preset, and the prompt tokens of every request it renders."""
    service = make_service(MODEL, engine="llamacpp", kv_budget_mb=512, max_context_tokens=65536)
    prompts: list[list[int]] = []
    original = service.prompt

    async def recording(*args: Any, **kwargs: Any) -> Any:
        prompt = await original(*args, **kwargs)
        prompts.append(list(prompt.tokens))
        return prompt

    service.prompt = recording
    return service, prompts


def test_a_new_conversation_reuses_the_last_ones_system_prompt_and_tools(proxy: RefusingProxy, tmp_path):
    """Two ``claude -p`` conversations with different first prompts, one folder: Claude Code's
    attribution line (its suffix differs) is dropped as volatile, so the second conversation's first
    request reuses ≥ 95 % of what the two prompts share (their system prompt and tools)."""
    service, prompts = recording_prompts()
    with messages_answered() as answers, running_server(service) as url:
        first = claude(tmp_path, url, MODEL, "Say hello.", proxy, max_output=32, tools=["Read"])
        marks = len(prompts), len(answers)
        second = claude(tmp_path, url, MODEL, "List three colours.", proxy, max_output=32, tools=["Read"])
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-2000:], second.stderr[-2000:])
    a, b = prompts[0], prompts[marks[0]]  # each conversation's first request
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert shared > 1000, shared  # the system prompt and the Read tool, the attribution line gone
    reused = answers[marks[1]]["usage"].get("cache_read_input_tokens") or 0
    assert reused >= 0.95 * shared, (reused, shared, len(b))
    print(f"second conversation: {reused} of {len(b)} prompt tokens reused; the two share {shared}")


def test_a_conversation_in_another_folder_reuses_past_its_path_under_the_opt_in(proxy: RefusingProxy, tmp_path):
    """Two ``claude -p`` conversations in two folders: their system prompts differ inside a line (the
    working directory). With the opt-in header (``ANTHROPIC_CUSTOM_HEADERS``) the second opens on the
    first's cached tokens and splices the path (conversation rule 4): its first request reads ≥ 95 %
    of the tokens the two prompts share from the cache (the shared runs counted by ``difflib``),
    reported as the source ``conversation``, where the prefix cache alone stops at the path."""
    service, prompts = recording_prompts()
    opt_in = {"X-Leyline-Client-Edits": "amortize"}
    with messages_answered() as answers, running_server(service) as url:
        first = claude(tmp_path / "alpha", url, MODEL, "Say hello.", proxy, 32, opt_in, tools=["Read"])
        marks = len(prompts), len(answers)
        second = claude(tmp_path / "beta-2", url, MODEL, "List three colours.", proxy, 32, opt_in, tools=["Read"])
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-2000:], second.stderr[-2000:])
    a, b = prompts[0], prompts[marks[0]]
    prefix = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    shared = sum(block.size for block in matcher.get_matching_blocks() if block.size >= 64)
    assert shared > prefix + 1000, (prefix, shared)  # the folders differ early; much is shared after
    answer = answers[marks[1]]
    reused = answer["usage"].get("cache_read_input_tokens") or 0
    assert reused >= 0.95 * shared, (reused, shared, prefix, len(b))
    assert "conversation" in answer["leyline"]["sources"], answer["leyline"]
    assert answer["leyline"]["approximate_tokens"] > 0
    print(f"second folder: {reused} of {len(b)} prompt tokens reused; prefix {prefix}, shared {shared}")
