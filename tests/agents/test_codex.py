"""Codex CLI (``@openai/codex``, pinned) on Leyline's Responses API, offline.

The tiny long-context preset on the llama.cpp engine holds Codex's first request (~22k tokens of
the tiny tokenizer: its system prompt, skills, tools). The model is random: its answer is noise,
and the run must still end cleanly — exit 0, every request answered — and a second run on the
same conversation (``codex exec resume --last``) must be served from cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.agents.clients import RefusingProxy, codex
from tests.e2e.server_helpers import make_service, running_server

MODEL = "tiny-gqa-long"


class Requests:
    """What the server served: every turn's token counts (each prompt token reused, rotated or prefilled)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Requests]]:
    service = make_service(MODEL, engine="llamacpp", kv_budget_mb=512, max_context_tokens=65536,
                           default_max_tokens=512)  # fmt: skip
    requests = Requests()
    original = service.metrics.record_tokens

    def recording(reused: int, rotated: int, prefilled: int, approximate: int) -> None:  # every turn's prefill
        original(reused, rotated, prefilled, approximate)
        requests.seen.append({"prompt": reused + rotated + prefilled, "reused": reused, "rotated": rotated,
                              "prefilled": prefilled})  # fmt: skip

    service.metrics.record_tokens = recording
    with running_server(service) as url:
        yield url + "/v1", requests


def test_codex_exec_runs_to_the_end_and_its_resumed_run_is_served_from_cache(served, proxy: RefusingProxy, tmp_path):
    url, requests = served
    first = codex(tmp_path, url, MODEL, "Say hello.", proxy)
    assert first.returncode == 0, first.stderr[-3000:]
    assert requests.seen and all(r["prompt"] > 15_000 for r in requests.seen)  # its whole first turn was served
    assert proxy.attempts == []  # plugins and update checks are off: nothing tried to leave
    before = len(requests.seen)
    second = codex(tmp_path, url, MODEL, "And now?", proxy, resume=True)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = requests.seen[before]
    previous = requests.seen[before - 1]
    assert resumed["reused"] >= previous["prompt"] * 0.95, (previous, resumed)  # the conversation's prefix: a hit
