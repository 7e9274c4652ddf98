"""The server as its own process under load: a soak with its memory sampled, and SIGKILL under agents.

* **Soak** (``LEYLINE_SOAK_S`` seconds, default 120): four workers on two keys send a mix of
  plain, streamed, abandoned, spliced, auto-spliced, block, tokenize and malformed requests
  while the server's RSS is sampled every 2 s. No 5xx; no memory growth after the warm-up (the
  first third). ``LEYLINE_SOAK_REPORT=path`` writes the numbers as JSON.
* **SIGKILL and restart**: three SDK agents talk to the server; it is killed (SIGKILL) and
  started again on the same port mid-conversation. Every agent finishes every turn (the SDK's
  retries ride over the restart) and its last prompt holds its whole conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from collections import Counter

import httpx

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_sdk import AsyncLeyline
from tests.attack.helpers import KEYS, MODEL, ServerProcess, auth

SOAK_S = float(os.environ.get("LEYLINE_SOAK_S", "120"))
CHAT = "/v1/chat/completions"


def _chat(messages: list[dict], **fields: object) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **fields}


def _user(rng: random.Random, words: int = 30) -> dict:
    return {"role": "user", "content": " ".join(f"w{rng.randint(0, 500)}" for _ in range(words))}


async def _step(c: httpx.AsyncClient, rng: random.Random, kind: str, key: str, statuses: Counter) -> None:
    """One soak action; every response status is counted."""

    async def send(method: str, path: str, headers: dict | None = None, **kw: object) -> httpx.Response:
        r = await c.request(method, path, headers={**auth(key), **(headers or {})}, **kw)  # type: ignore[arg-type]
        statuses[r.status_code] += 1
        if r.status_code >= 400:
            statuses[f"{r.status_code} {r.json()['error']['code']}"] += 1
        return r

    if kind == "plain":
        await send("POST", CHAT, json=_chat([SYSTEM, _user(rng)]))
    elif kind == "stream":
        async with c.stream("POST", CHAT, headers=auth(key), json=_chat([_user(rng)], stream=True)) as r:
            statuses[r.status_code] += 1
            async for _ in r.aiter_lines():
                pass
    elif kind == "abandon":  # the client goes away mid-stream
        async with c.stream("POST", CHAT, headers=auth(key), json=_chat([_user(rng)], stream=True, max_tokens=64)) as r:
            statuses[r.status_code] += 1
            async for _ in r.aiter_lines():
                break
    elif kind == "session":
        r = await send("POST", "/v1/leyline/sessions", json={"tokens": [rng.randint(5, 900) for _ in range(200)]})
        if r.status_code != 200:
            return
        sid = r.json()["id"]
        edit = {"start": 20, "end": 60, "replacement": [7, 8, 9]}
        await send("POST", f"/v1/leyline/sessions/{sid}/directives", json={"directives": [edit]})
        huge = {"start": 10, "end": 10, "replacement": [7] * 8000}  # past the context: refused, untouched
        await send("POST", f"/v1/leyline/sessions/{sid}/directives", json={"directives": [huge]})
        await send("DELETE", f"/v1/leyline/sessions/{sid}")
    elif kind == "splice":
        messages = [SYSTEM, _user(rng, 80), _user(rng)]
        r = await send("POST", CHAT, json=_chat(messages, leyline={}))
        if r.status_code != 200:
            return
        first = r.json()["leyline"]
        span = (await send("POST", "/v1/leyline/tokenize", json={"messages": messages})).json()["message_spans"][1]
        cut = {"start": span["start"], "end": span["end"], "replacement": [11, 12]}
        ext = {"session_id": first["session_id"], "directives": [cut]}
        await send("POST", CHAT, json=_chat(messages, leyline=ext))
    elif kind == "auto":  # a plain client's growing conversation (auto-splice continues it)
        messages = [SYSTEM, _user(rng)]
        for _ in range(3):
            r = await send("POST", CHAT, json=_chat(messages))
            if r.status_code != 200:
                break
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""}]
            messages += [_user(rng, 10)]
    elif kind == "block":
        r = await send("POST", "/v1/leyline/blocks", json={"tokens": [rng.randint(5, 900) for _ in range(100)]})
        if r.status_code == 200:
            await send("DELETE", f"/v1/leyline/blocks/{r.json()['id']}")
    elif kind == "tokenize":
        await send("POST", "/v1/leyline/tokenize", json={"messages": [_user(rng, 5) for _ in range(60)]})
    else:  # malformed, oversized, unauthenticated
        bad = rng.choice(
            [
                b'{"model": "tiny-gqa", "messages": [{"role": "user", "content": "\\ud800"}]}',
                b'{"model": "tiny-gqa", "messages": [',
                json.dumps(_chat([_user(rng)], logit_bias={"\u00b2": 1})).encode(),
                json.dumps(_chat([{"role": "user", "content": "x"}] * 3000)).encode(),
                b"x" * (9 << 20),
            ]
        )
        await send("POST", CHAT, content=bad, headers={"Content-Type": "application/json"})
        r = await c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        statuses[r.status_code] += 1


KINDS = ["plain", "stream", "abandon", "session", "splice", "auto", "block", "tokenize", "bad"]


async def _worker(url: str, seed: int, deadline: float, statuses: Counter) -> None:
    rng = random.Random(seed)
    key = KEYS[seed % 2]
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        i = seed
        while time.monotonic() < deadline:
            await _step(c, rng, KINDS[i % len(KINDS)], key, statuses)
            i += 1


async def test_soak_no_5xx_and_no_memory_growth(engine):
    flags = ["--api-key", KEYS[0], "--api-key", KEYS[1], "--auto-splice", "--max-sessions", "128"]
    with ServerProcess(engine, None, *flags) as server:
        statuses: Counter = Counter()
        samples: list[tuple[float, int]] = []
        started = time.monotonic()
        deadline = started + SOAK_S
        workers = [asyncio.create_task(_worker(server.url, seed, deadline, statuses)) for seed in range(4)]
        while not all(w.done() for w in workers):
            samples.append((time.monotonic() - started, server.rss()))
            await asyncio.sleep(2.0)
        await asyncio.gather(*workers)
        samples.append((time.monotonic() - started, server.rss()))
        assert (await asyncio.to_thread(httpx.get, server.url + "/health")).status_code == 200
    warm = [rss for t, rss in samples if SOAK_S / 3 <= t < SOAK_S / 2]
    late = [rss for t, rss in samples if t >= SOAK_S * 5 / 6]
    report = {
        "engine": engine,
        "seconds": round(samples[-1][0], 1),
        "requests": sum(n for s, n in statuses.items() if isinstance(s, int)),
        "statuses": dict(sorted(statuses.items(), key=str)),
        "rss_mb_start": round(samples[0][1] / 2**20, 1),
        "rss_mb_after_warmup": round(statistics.median(warm) / 2**20, 1),
        "rss_mb_end": round(statistics.median(late) / 2**20, 1),
        "rss_mb_max": round(max(rss for _, rss in samples) / 2**20, 1),
    }
    print(json.dumps(report))
    if os.environ.get("LEYLINE_SOAK_REPORT"):
        with open(os.environ["LEYLINE_SOAK_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    assert not [s for s in statuses if str(s) >= "5"], report
    assert statuses[200] > 50, report
    growth = report["rss_mb_end"] - report["rss_mb_after_warmup"]
    assert growth < max(16.0, 0.05 * report["rss_mb_after_warmup"]), report


async def _agent(url: str, n: int, turns: int, done: list[int]) -> list[int]:
    """One agent's conversation (agent 0 through an explicit session); returns its prompt sizes."""
    client = AsyncLeyline(base_url=url + "/v1", api_key=KEYS[0], max_retries=8)
    session = client.session(tools=TOOLS) if n == 0 else None
    messages = [SYSTEM, {**TASK, "content": f"{TASK['content']} (agent {n})"}]
    prompts = []
    try:
        for turn in range(turns):
            sent = messages
            kwargs = {"model": MODEL, "messages": sent, "tools": TOOLS, "max_tokens": 2}
            if session is not None:
                r = await session.create(**kwargs)
            else:
                r = await client.chat.completions.create(**kwargs)
            prompts.append(r.usage.prompt_tokens)
            done[n] = turn + 1
            messages = sent + agent_turn(turn + 10 * n, lines=8)
            await asyncio.sleep(0.3)  # the agent's tool runs
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await c.post("/v1/leyline/tokenize", json={"messages": sent, "tools": TOOLS}, headers=auth(KEYS[0]))
        assert prompts[-1] == len(r.json()["tokens"]), "the last prompt holds the whole conversation"
        return prompts
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


async def test_sigkill_and_restart_under_sdk_agents_loses_nothing(engine):
    server = ServerProcess(engine, None, "--api-key", KEYS[0]).start()
    try:
        done = [0, 0, 0]
        turns = 12
        agents = [asyncio.create_task(_agent(server.url, n, turns, done)) for n in range(3)]
        while min(done) < 2 and not any(a.done() for a in agents):
            await asyncio.sleep(0.05)
        server.kill()  # mid-conversation, requests in flight
        await asyncio.sleep(1.0)
        restarted = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, server.start)
        down = time.monotonic() - restarted + 1.0
        results = await asyncio.gather(*agents)
        assert done == [turns] * 3
        assert max(d for d in done) == turns and down > 1.0
        for prompts in results:
            assert prompts == sorted(prompts), prompts  # every turn saw the conversation so far
    finally:
        server.stop()
