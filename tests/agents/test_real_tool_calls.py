"""Tool calls as a real model writes them, on all three protocols: valid calls, no framing in the text.

The 24 prompts of ``benchmarks/tool_call_cases.py`` (one tool, several tools, a required call,
nested arguments) asked of Qwen2.5-Coder-1.5B on the llama.cpp engine (greedy) through each
protocol's own client (openai for Chat Completions and the Responses API, anthropic for the
Messages API). The oracle is the client's parsed answer: each call must name an offered tool and
its arguments validate against that tool's JSON schema (``jsonschema``); the shown text must hold
no call syntax. The target is the issue's: at least 95 % valid calls (23 of 24) on every protocol,
and framing never. ``benchmarks/bench_tool_calls.py`` runs the same cases streamed too, on both
model sizes (docs/results/tool_calls.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leyline_server.local import local_service, serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from tool_call_cases import CASES, PROTOCOLS, ask, judge  # noqa: E402

MODEL = "qwen2.5-coder-1.5b"
TARGET = 0.95


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, Any]]:
    import anthropic
    import openai

    service = local_service(MODEL, engine="llamacpp", kv_budget_mb=512, max_context_tokens=8192, default_max_tokens=256)
    with serve_in_thread(service) as url:
        yield {
            "openai": openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600),
            "anthropic": anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=600),
        }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_real_model_s_tool_calls_come_back_as_valid_calls(clients, protocol):
    verdicts = {case.name: judge(case, ask(clients, protocol, MODEL, case, False)) for case in CASES}
    framed = [name for name, v in verdicts.items() if v["framing"]]
    invalid = [name for name, v in verdicts.items() if not v["valid"]]
    assert not framed, f"call syntax left in the text: {framed}"
    assert len(CASES) - len(invalid) >= TARGET * len(CASES), f"not valid calls: {invalid}"
    print(f"{MODEL} {protocol}: {len(CASES) - len(invalid)}/{len(CASES)} valid calls, framing 0")
