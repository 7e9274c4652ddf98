"""Concurrent streams decode in shared steps and answer as they would one after the other.

A real server on a loopback port, ``tiny-gqa`` on the embedded engine and on llama.cpp (the same
weights). Eight greedy streams at once must give the tokens the same eight requests give one at a
time (the oracle), while the server's scheduler runs fewer steps than they have tokens. A batch
changes the shapes of the matrix products, so logits may differ by float32 rounding (about 1e-6
relative on these models, ``tests/server/test_batch.py`` and ``tests/llamacpp/test_batch.py``
bound it); the tiny models' logits are peaked (initializer range 0.2), so greedy answers are equal.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json

import httpx
import pytest

from tests.e2e.server_helpers import make_service, running_server

pytestmark = pytest.mark.slow

ENGINES = ["embedded"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") is not None else [])
MODEL = "tiny-gqa"
TOKENS = 24


def _body(i: int, stream: bool) -> dict:
    words = " ".join(f"w{(i * 37 + j * 11) % 97}" for j in range(3 + 4 * i))
    return {"model": MODEL, "messages": [{"role": "user", "content": f"request {i}: {words}"}],
            "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "stream": stream,
            "leyline": {}}  # fmt: skip


async def _streamed(c: httpx.AsyncClient, i: int) -> list[int]:
    ids: list[int] = []
    async with c.stream("POST", "/v1/chat/completions", json=_body(i, True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("leyline"):
                    ids = chunk["leyline"]["completion_token_ids"]
    return ids


@pytest.mark.parametrize("engine", ENGINES)
async def test_eight_concurrent_greedy_streams_give_the_sequential_tokens(engine):
    svc = make_service(MODEL, engine=engine, layers=2, kv_budget_mb=8)
    with running_server(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            sequential = []
            for i in range(8):
                r = await c.post("/v1/chat/completions", json=_body(i, False))
                sequential.append(r.json()["leyline"]["completion_token_ids"])
            before = svc.engine.scheduler.steps
            concurrent = await asyncio.gather(*(_streamed(c, i) for i in range(8)))
            steps = svc.engine.scheduler.steps - before
    assert all(len(ids) == TOKENS for ids in sequential)
    assert concurrent == sequential
    assert steps < 8 * TOKENS // 2, f"{steps} steps for {8 * TOKENS} tokens: the streams did not share steps"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "count": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["name", "count", "ok"], "additionalProperties": False}  # fmt: skip


def _constrained(i: int) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
    return {**_body(i, False), "response_format": fmt, "max_tokens": 60, "ignore_eos": False,
            "logprobs": True, "top_logprobs": 2}  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
async def test_constrained_streams_with_logprobs_in_one_batch_answer_as_alone(engine):
    import jsonschema

    svc = make_service(MODEL, engine=engine, layers=2, kv_budget_mb=8)
    with running_server(svc) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            alone = [(await c.post("/v1/chat/completions", json=_constrained(i))).json() for i in range(4)]
            together = await asyncio.gather(*(c.post("/v1/chat/completions", json=_constrained(i)) for i in range(4)))
    for one, batched in zip(alone, (r.json() for r in together), strict=True):
        content = batched["choices"][0]["message"]["content"]
        if batched["choices"][0]["finish_reason"] == "stop":
            jsonschema.validate(json.loads(content), SCHEMA)  # the grammar held inside the batch
        assert content == one["choices"][0]["message"]["content"]
        got = [e["logprob"] for e in batched["choices"][0]["logprobs"]["content"]]
        expected = [e["logprob"] for e in one["choices"][0]["logprobs"]["content"]]
        assert got == pytest.approx(expected, abs=1e-3)  # float32 rounding of the batched forward
