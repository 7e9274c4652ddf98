"""A reasoning agent on a template that strips old reasoning: Leyline vs plain prefix caching, per turn.

    .venv/bin/python benchmarks/bench_reasoning.py [--turns 20] [--calls 4] [--lines 20] [--words 60]

The trace (``traces.reasoning_agent_trace``) is a tool-heavy reasoning agent: per user query,
``--calls`` tool calls, then an answer; every answer starts with a ``<think>`` block. The server
is the real embedded one in-process (``tiny-mla``), its tokenizer carrying
``traces.REASONING_TEMPLATE``, which drops every earlier reasoning block once a new query
arrives — as Qwen3's, DeepSeek-R1's and QwQ's templates do. Two runs of the same trace:

* **Leyline** — ``AsyncLeyline`` (no policies): the template's edits become ``amortize``
  deletions (``leyline_sdk.explain.turns``), the rest of the cache is kept and rotated;
* **plain** — the ``openai`` client against a server without sessions: its radix prefix cache
  reuses each prompt up to the first difference, the first stripped reasoning block.

The model has random weights, so what it generates is noise (one token per request); the agent
records the trace's scripted answers instead, and those are new to the server either way. The
``new`` column counts them: the tokens of the messages appended since the previous request (the
last answer, the tool output or the query, the generation prompt). Prefilled beyond ``new`` is
re-prefill. A second table times the alignment alone on long conversations of the same trace.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from benchmarks.traces import TOOLS, messages_at, reasoning_agent_trace, reasoning_tokenizer  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_sdk.core.directives import Mode, apply  # noqa: E402
from leyline_sdk.explain.turns import decoder_of, explain_turn  # noqa: E402
from leyline_sdk.render.rendering import HFChatTokenizer  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402

HEADER = "<|im_start|>assistant\n"


def new_tokens(chat: HFChatTokenizer, messages: list[dict[str, Any]], turn: int) -> int:
    """Tokens of what was appended since the previous request: the last answer (after its header) on."""
    text = chat.render_text(messages, TOOLS, True)
    if turn == 0:
        return len(chat.encode(text)[0])
    start = text.rindex(HEADER, 0, len(text) - len(HEADER)) + len(HEADER)  # the header was the generation prompt
    tokens, offsets = chat.encode(text)
    return sum(1 for a, _ in offsets if a >= start)


def service(reasoning: bool, context: int) -> Any:
    """A fresh in-process service with the reasoning template on its tokenizer."""
    svc = local_service("tiny-mla", max_context_tokens=context, kv_budget_mb=96)
    svc.tokenizer.chat_template = reasoning_tokenizer().chat_template
    return svc


async def run_leyline(steps: list, context: int) -> list[dict[str, Any]]:
    """Per-turn server counts for the SDK client."""
    chat = HFChatTokenizer(reasoning_tokenizer())
    with serve_in_thread(service(True, context)) as url:
        client = AsyncLeyline(base_url=url + "/v1", api_key="x", tokenizer=chat, max_retries=0)
        session = client.session(tools=TOOLS)
        for t in range(len(steps)):
            await session.create(model="tiny-mla", messages=messages_at(steps, t), max_tokens=1, temperature=0)
            assert session.stats[-1].fallback is None, session.stats[-1]
        rows = [s.model_dump() for s in session.stats]
        await client.aclose()
    return rows


async def run_plain(steps: list, context: int) -> list[dict[str, int]]:
    """Per-turn prompt and prefilled tokens for a plain OpenAI client (radix prefix cache only)."""
    rows = []
    with serve_in_thread(service(True, context)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for t in range(len(steps)):
            r = await client.chat.completions.create(
                model="tiny-mla", messages=messages_at(steps, t), tools=TOOLS, max_tokens=1, temperature=0
            )
            assert r.usage is not None
            cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
            rows.append({"prompt": r.usage.prompt_tokens, "prefilled": r.usage.prompt_tokens - (cached or 0)})
        await client.close()
    return rows


def per_turn_table(steps: list, leyline: list[dict[str, Any]], plain: list[dict[str, int]]) -> None:
    chat = HFChatTokenizer(reasoning_tokenizer())
    print("| turn | kind | prompt | new | Leyline prefilled | rotated | template directives | plain prefilled |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals = {"new": 0, "ley": 0, "plain": 0}
    query_rows = []
    for t, (step, ley, pl) in enumerate(zip(steps, leyline, plain, strict=True)):
        new = new_tokens(chat, messages_at(steps, t), t)
        kind = "first" if t == 0 else step.kind
        print(
            f"| {t + 1} | {kind} | {ley['prompt_tokens']:,} | {new:,} | {ley['prefilled_tokens']:,} | "
            f"{ley['rotated_tokens']:,} | {ley['template_directives']} | {pl['prefilled']:,} |"
        )
        if t:
            totals["new"] += new
            totals["ley"] += ley["prefilled_tokens"]
            totals["plain"] += pl["prefilled"]
        if kind == "query":
            query_rows.append((ley["prefilled_tokens"], pl["prefilled"], new, ley["prompt_tokens"]))
    print()
    print(
        f"after the first request: prefilled {totals['ley']:,} (Leyline) vs {totals['plain']:,} (plain); "
        f"new content {totals['new']:,}"
    )
    for ley, pl, new, prompt in query_rows:
        print(
            f"query turn, prompt {prompt:,}: prefilled {ley:,} = {ley / prompt:.1%} (Leyline; {ley - new:,} beyond "
            f"the new messages) vs {pl:,} = {pl / prompt:.1%} (plain; {pl - new:,} beyond)"
        )


def alignment_table(sizes: list[int]) -> None:
    """The SDK's explanation alone (alignment, labels, verification) on long conversations."""
    chat = HFChatTokenizer(reasoning_tokenizer())
    decode = decoder_of(chat)
    print("\n| conversation | base tokens | directives | explain ms (median of 3) | re-prefill |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for turns in sizes:
        steps = reasoning_agent_trace(turns=turns + 1, calls_per_query=turns - 1, output_lines=60)
        before = messages_at(steps, turns - 1)
        old = chat.render(before, tools=TOOLS)
        text = chat.render_text(before + [steps[turns - 1].answer], TOOLS, False)
        base = old.tokens + chat.encode(text[text.rindex(HEADER) + len(HEADER) :].removesuffix("\n"))[0]
        new = chat.render(messages_at(steps, turns), tools=TOOLS)
        times = []
        for _ in range(3):
            started = time.perf_counter()
            ex = explain_turn(base, old, new, len(before), {}, None, decode)
            times.append((time.perf_counter() - started) * 1e3)
        result = apply(base, ex.directives)
        assert new.tokens[: len(result)] == result and all(d.mode is Mode.AMORTIZE for d in ex.directives)
        print(
            f"| {turns} answers, a new query | {len(base):,} | {len(ex.directives)} | "
            f"{statistics.median(times):.1f} | {len(new.tokens) - len(result)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--calls", type=int, default=4, help="tool calls per user query")
    parser.add_argument("--lines", type=int, default=20, help="lines per tool output")
    parser.add_argument("--words", type=int, default=60, help="words of reasoning per answer")
    parser.add_argument("--align-sizes", type=int, nargs="*", default=[40, 80], help="answers per conversation")
    args = parser.parse_args()
    steps = reasoning_agent_trace(args.turns, args.calls, args.words, args.lines)
    context = 8192  # the tiny model's positions
    leyline = asyncio.run(run_leyline(steps, context))
    plain = asyncio.run(run_plain(steps, context))
    per_turn_table(steps, leyline, plain)
    if args.align_sizes:
        alignment_table(args.align_sizes)


if __name__ == "__main__":
    main()
