"""The canary means the same on every engine: staged rows against the model's own layer-0 keys.

Driven through each engine's :class:`~leyline_server.contract.base.SpliceBackend` (in this
process, on the engine's own thread): a session's run moved and a block placed in one stage,
then ``canary(stage, positions, tokens)``. It passes for the tokens that really land there and
fails — by orders of magnitude — for other tokens at the same positions: an engine that compared
two rotations of the same rows, or read the rows from the wrong handle, would pass both.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leyline_sdk.core.directives import KeptRun
from leyline_server.contract.values import CacheScope
from tests.conformance.servers import MODELS, SERVES, available_engines

SESSION = [(53 * i + 5) % 900 + 60 for i in range(80)]
BLOCK = [(37 * i + 11) % 900 + 60 for i in range(16)]
KEEP, AT = 20, 20  # keep [0, 20), place the block at 20, the session's [20, 80) moves to 36
BACKENDS = [
    pytest.param((e, m), id=f"{e}-{m}", marks=pytest.mark.slow)
    for e in available_engines()
    for m in ("gqa-1", "mla-1")
    if m in SERVES.get(e, ())
]


def _build(engine: str, model: str) -> Any:
    from leyline_server.engines.config import EngineConfig
    from leyline_server.engines.factory import build_engine

    name, layers = MODELS[model]
    if engine != "sglang":  # float32 KV, as the conformance servers (llama.cpp's default float16: test_loader)
        config = EngineConfig(
            engine=engine, model=name, kv_budget_mb=16.0, kv_cache_dtype="float32", preset_layers=layers
        )
        return build_engine(config)[0]
    from tests.sglang.cpu_server import CPU_FLAGS, checkpoint

    argv = ["--model-path", str(checkpoint(name, layers)), *CPU_FLAGS, "--max-total-tokens", "4096"]
    return build_engine(EngineConfig(engine="sglang", model=name, engine_args=tuple(argv)))[0]


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> Any:
    """An engine built in this process (SGLang: launched on the CPU, its schedulers as subprocesses)."""
    built = _build(*request.param)
    yield built
    asyncio.run(built.close())


async def _on_engine(engine: Any, fn: Any) -> Any:
    """Run ``fn(backend)`` where the engine runs its splices (its worker thread, or any thread for SGLang)."""
    worker = getattr(engine, "worker", None)
    backend = getattr(engine, "backend", None) or engine.core
    if worker is not None:
        return await worker.call(fn, backend)
    return await asyncio.to_thread(fn, backend)


def _canaries(be: Any) -> dict[str, Any]:
    session = be.prefill(SESSION, CacheScope(private="canary-session")).handle
    block = be.prefill(BLOCK, CacheScope(private="canary-block")).handle
    stage = be.begin(session, KEEP)
    try:
        be.move(stage, session, [KeptRun(KEEP, len(SESSION), AT + len(BLOCK))])
        be.move(stage, block, [KeptRun(0, len(BLOCK), AT)])
        moved = [AT + len(BLOCK), AT + len(BLOCK) + 30, AT + len(BLOCK) + 59]
        placed = [AT, AT + 7, AT + 15]
        right = [SESSION[KEEP], SESSION[KEEP + 30], SESSION[KEEP + 59], BLOCK[0], BLOCK[7], BLOCK[15]]
        off_by_one = [SESSION[KEEP - 1], SESSION[KEEP + 29], SESSION[KEEP + 58]]
        handle_ignored = [SESSION[0], SESSION[7], SESSION[15]]  # what a move that ignored its handle places
        return {
            "right": be.canary(stage, moved + placed, right),
            "other tokens": be.canary(stage, moved + placed, [(t + 1) % 1000 + 7 for t in right]),
            "the session's rows where the block lands": be.canary(stage, placed, handle_ignored),
            "each row one position off": be.canary(stage, moved, off_by_one),
        }
    finally:
        be.abort(stage)
        be.release(session)
        be.release(block)


async def test_the_canary_compares_staged_rows_with_the_models_own_keys(engine):
    results = await _on_engine(engine, _canaries)
    right = results.pop("right")
    assert right.ran and right.error < right.tolerance, right
    for case, result in results.items():
        assert result.ran and result.error > 100 * result.tolerance, (case, result)
