"""SGLangClient (the tokenizer manager on its own loop thread) against a stand-in tokenizer manager.

The stand-in has the manager's attributes the client uses (``event_loop``, ``asyncio_tasks``,
``handle_loop``, ``_result_dispatcher`` — SGLang's real ``TypeBasedDispatcher`` —
``_dispatch_to_scheduler``, ``generate_request``, ``abort_request``); control requests cross
SGLang's real msgpack encoding to the harness scheduler and come back through the handle loop,
as replies from the ZMQ socket do. Requests use the harness's request path.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from leyline_server.contract.values import CacheScope
from leyline_server.engines.sglang.backend import ControlError
from leyline_server.engines.sglang.client import FILL_MAX_NEW_TOKENS, SGLangClient
from tests.sglang.harness import Runtime


class FakeTokenizerManager:
    """What SGLangClient touches of SGLang's TokenizerManager (see the module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        from sglang.utils import TypeBasedDispatcher

        self.rt = rt
        self.event_loop = None
        self.asyncio_tasks: set[Any] = set()
        self._result_dispatcher = TypeBasedDispatcher([])
        self.replies: asyncio.Queue[Any] | None = None
        self.aborted: list[str] = []
        self.threads: set[str] = set()

    async def handle_loop(self) -> None:
        self.replies = asyncio.Queue()
        while True:
            self._result_dispatcher(await self.replies.get())

    def _dispatch_to_scheduler(self, obj: Any) -> None:
        from sglang.srt.managers import io_struct

        self.threads.add(threading.current_thread().name)
        req = io_struct.msgpack_decode(io_struct.msgpack_encode(obj))
        out = io_struct.msgpack_decode(io_struct.msgpack_encode(self.rt.scheduler._request_dispatcher(req)))
        assert self.replies is not None
        self.replies.put_nowait(out)

    async def generate_request(self, obj: Any, request: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        tokens = list(obj.input_ids)
        if not obj.stream:
            assert obj.sampling_params["max_new_tokens"] == FILL_MAX_NEW_TOKENS
            cached = self.rt.prefill(tokens, obj.cache_salt)
            yield {"output_ids": [0], "meta_info": {"cached_tokens": cached, "finish_reason": {"type": "length"}}}
            return
        ids: list[int] = []  # SGLang hands out one growing list (non-incremental streaming)
        n = obj.sampling_params["max_new_tokens"]
        for i in range(n):
            ids.append(100 + i)
            yield {"output_ids": ids, "meta_info": {"finish_reason": {"type": "length"} if i == n - 1 else None}}
            await asyncio.sleep(0.01)

    def abort_request(self, rid: str = "") -> None:
        self.aborted.append(rid)


@pytest.fixture
def client():
    rt = Runtime("mha", pool_tokens=64)
    tm = FakeTokenizerManager(rt)
    c = SGLangClient(tm)
    yield c
    c.close()
    rt.check()


def test_control_prefill_and_post_run_on_the_managers_loop(client):
    tm = client.tm
    assert tm.event_loop is client.loop and len(tm.asyncio_tasks) == 1
    assert client.control("info", {})["kind"] == "mha"
    assert client.prefill(list(range(10, 30)), "ns") == 0
    assert client.prefill(list(range(10, 40)), "ns") == 20
    reply = client.control("pin", {"pin": 1, "tokens": list(range(10, 40)), "ns": "ns"})
    assert reply["cached"] == 30
    client.post("unpin", {"pin": 1})
    client.control("probe", {"tokens": [1], "ns": None})  # replies come back in order: the unpin is done
    assert tm.rt.tree.protected_size() == 0
    with pytest.raises(ControlError, match="unknown_op"):
        client.control("nope", {})
    assert tm.threads == {"leyline-sglang-loop"}


def test_concurrent_controls_get_their_own_replies(client):
    from concurrent.futures import ThreadPoolExecutor

    client.prefill(list(range(10, 30)), "a")

    def probe(n: int) -> int:
        return client.control("probe", {"tokens": list(range(10, 10 + n)), "ns": "a"})["matched"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(probe, range(1, 21))) == list(range(1, 21))


async def test_stream_snapshots_chunks_and_aborts_when_closed_early(client):
    chunks = [c async for c in client.generate([1, 2, 3], "ns", {"max_new_tokens": 3}, {})]
    assert [c["output_ids"] for c in chunks] == [[100], [100, 101], [100, 101, 102]]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length"}
    stream = client.generate([1, 2, 3], "ns", {"max_new_tokens": 50}, {})
    assert (await stream.__anext__())["output_ids"] == [100]
    await stream.aclose()
    await asyncio.sleep(0.05)
    assert len(client.tm.aborted) == 1 and client.tm.aborted[0].startswith("leyline-gen-")


@pytest.mark.parametrize("refuse", [False, True])
def test_build_sglang_engine_launches_checks_and_refuses(refuse, monkeypatch, tmp_path):
    """The launch glue with SGLang's Engine replaced by the stand-in (server-arg resolution needs a GPU)."""
    import json
    from types import SimpleNamespace

    import sglang.srt.arg_groups.overrides as overrides
    from sglang.srt.server_args import ServerArgs

    from leyline_server.engines.sglang import launch

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    rt = Runtime("mla", pool_tokens=64)
    rt.scheduler.page_size = 16 if refuse else 1
    rt.scheduler._leyline_splicer = None  # built again, for this page size, by the first control request
    calls: list[str] = []
    tm = FakeTokenizerManager(rt)
    tm.tokenizer = "the tokenizer"
    monkeypatch.setattr(
        launch, "_launch", lambda args: SimpleNamespace(tokenizer_manager=tm, shutdown=lambda: calls.append("down"))
    )
    monkeypatch.setattr(ServerArgs, "resolve_once", lambda self: calls.append("resolved"))
    monkeypatch.setattr(overrides, "resolving_view", lambda args: args)
    if refuse:
        with pytest.raises(ValueError, match="page size 16"):
            launch.build_sglang_engine(["--model-path", str(tmp_path)])
        assert calls == ["resolved", "down"]
        return
    engine, tokenizer = launch.build_sglang_engine(["--model-path", str(tmp_path)], served_name="served")
    assert tokenizer == "the tokenizer" and calls == ["resolved"]
    assert engine.info.name == "served" and engine.info.engine == "sglang" and engine.info.shiftable
    assert engine.info.kv_capacity_tokens == 64 and engine.info.eos_token_ids == (2,)

    async def turn() -> None:
        handle = await engine.open(list(range(10, 30)), CacheScope(private="s"))
        assert handle.cached == 20
        engine.release(handle)
        await engine.close()

    asyncio.run(turn())
    assert calls == ["resolved", "down"]
    rt.check()
