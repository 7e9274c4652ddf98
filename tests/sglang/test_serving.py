"""The SGLang engine behind Leyline's Engine protocol and its unchanged HTTP app (CPU).

The engine, service, routes and executor are production code; the client is the harness's
runtime: SGLang's real tree, allocator, pool and plugin, with the request path (prefill and
greedy decoding) as the test double described in ``harness.py``.
"""

from __future__ import annotations

import httpx

from leyline_sdk.core.directives import apply
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_server.api.app import create_app
from leyline_server.api.service import LeylineService, ServerConfig
from leyline_server.contract.values import SamplingParams, SpliceRequest
from leyline_server.engines.sglang.launch import _model_info
from leyline_server.engines.sglang.serving import AsyncSGLangEngine
from tests.sglang.harness import Runtime
from tests.sglang.test_splice import BASE, EDIT, SCOPE


def _engine(rt: Runtime) -> AsyncSGLangEngine:
    return AsyncSGLangEngine(rt, _model_info(rt.control("info", {}), "tiny"))


async def test_turn_splices_prefills_streams_and_repins():
    rt = Runtime("mla")
    engine = _engine(rt)
    handle = await engine.open(BASE, SCOPE)
    prompt = apply(BASE, EDIT) + [5, 6]
    turn = await engine.start_turn(prompt, SCOPE, handle, SpliceRequest(EDIT, prompt=prompt))
    assert turn.report is not None and turn.report.applied and turn.report.canary == "passed"
    assert (turn.reused, turn.approximate) == (57, 57 - 22)  # the spliced path, rotated from position 22
    steps = [step async for step in engine.stream(turn, SamplingParams(max_tokens=3))]
    assert [s.finish_reason for s in steps] == [None, None, "length"]
    assert turn.generated == [s.token for s in steps]
    assert turn.handle.tokens == prompt + turn.generated and turn.handle.cached == len(prompt) + 2
    rt.check()
    engine.release(turn.handle)
    await engine.close()
    rt.check()
    assert rt.tree.protected_size() == 0


async def test_leyline_http_app_serves_unchanged_on_top():
    rt = Runtime("mha")
    service = LeylineService(_engine(rt), load_tiny_tokenizer(), ServerConfig(model_name="tiny", default_max_tokens=2))
    transport = httpx.ASGITransport(app=create_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        sid = (await client.post("/v1/leyline/sessions", json={"tokens": BASE})).json()["id"]
        body = {"directives": [d.model_dump() for d in EDIT], "base": {"length": len(BASE)}}
        r = await client.post(f"/v1/leyline/sessions/{sid}/directives", json=body)
        assert r.status_code == 200 and r.json()["applied"], r.text
        r = await client.get(f"/v1/leyline/sessions/{sid}")
        assert r.json()["tokens"] == apply(BASE, EDIT)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "leyline": {}}
        r = await client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        assert len(r.json()["leyline"]["completion_token_ids"]) == 2
    rt.check()
    await service.shutdown()
    rt.check()
    assert rt.tree.protected_size() == 0  # every session released its pin
