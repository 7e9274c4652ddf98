"""Building the llama.cpp engine from the CLI's model names, and the KV pool's size."""

from __future__ import annotations

import asyncio
import os

import llama_cpp
import pytest

from leyline_server.cli import build_service, main, parse_args
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.factory import build_engine
from leyline_server.engines.llamacpp.lib import LlamaModel
from leyline_server.engines.llamacpp.loader import kv_cells, resolve_gguf
from leyline_server.models import find_smollm2_gguf
from tests.conformance.test_canary import _canaries


def test_model_names_resolve(tiny1, tmp_path):
    assert resolve_gguf("smollm2-135m") == find_smollm2_gguf()
    assert resolve_gguf(str(tiny1)) == tiny1
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(tiny1.read_bytes())
    assert resolve_gguf(str(folder)) == folder / "m.gguf"
    (folder / "n.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="2 .gguf files"):
        resolve_gguf(str(folder))
    assert resolve_gguf("tiny-gqa", layers=1).suffix == ".gguf"
    with pytest.raises(ValueError, match="llama-style"):
        resolve_gguf("tiny-mla")  # MLA has no llama.cpp GGUF here
    with pytest.raises(ValueError, match=r"\.gguf"):
        resolve_gguf(str(tmp_path / "missing.gguf"))


def test_kv_budget_sets_the_cells(tiny1):
    model = LlamaModel(tiny1)  # 1 layer, 2 KV heads of 16: 64 K+V elements per cell
    assert model.kv_row == 64 and model.n_layer == 1
    assert kv_cells(model, 1.0, "float32") == 2**20 // 256 // 256 * 256 == 4096
    assert kv_cells(model, 1.0, "float16") == 8192
    assert kv_cells(model, 0.0001, "float16") == 256  # llama.cpp's minimum
    model.close()


def test_the_cli_builds_the_llamacpp_engine():
    args = parse_args(
        ["--engine", "llamacpp", "--model-path", "tiny-gqa", "--preset-layers", "1", "--kv-budget-mb", "2"]
    )
    service = build_service(args)
    info = service.engine.info
    assert info.engine == "llamacpp" and info.kv_capacity_tokens == 16384 and info.shiftable  # float16 KV
    assert service.chat.render([{"role": "user", "content": "hi"}]).tokens[:1] == [1]  # <|im_start|>
    asyncio.run(service.shutdown())


def test_swap_space_and_disable_prefix_cache_reach_the_engine():
    flags = ["--engine", "llamacpp", "--model-path", "tiny-gqa", "--preset-layers", "1", "--kv-budget-mb", "1"]
    service = build_service(parse_args([*flags, "--swap-space", "0.5", "--disable-prefix-cache"]))
    core = service.engine.core
    assert core.cache.park_budget == 2**29 and core.prefix_cache is False
    asyncio.run(service.shutdown())
    service = build_service(parse_args(flags))
    assert service.engine.core.cache.park_budget == 4 << 30 and service.engine.core.prefix_cache is True
    asyncio.run(service.shutdown())
    with pytest.raises(ValueError, match="--swap-space"):
        build_service(parse_args([*flags, "--swap-space", "-1"]))
    embedded = build_service(parse_args(["--model-path", "tiny-gqa", "--disable-prefix-cache"]))
    assert embedded.engine.core.prefix_cache is False  # the flag is honoured on every engine
    asyncio.run(embedded.shutdown())


def test_every_config_field_reaches_the_llamacpp_engine():
    config = EngineConfig(
        engine="llamacpp",
        model="tiny-gqa",
        served_name="served",
        dtype="bfloat16",
        kv_cache_dtype="float32",
        preset_layers=1,
        kv_budget_mb=1.0,
        context_length=1000,
        prefix_cache=False,
        swap_space_gb=0.25,
    )
    engine, _ = build_engine(config)
    core = engine.core  # type: ignore[attr-defined]
    assert core.model.n_layer == 1 and core.kv_type == "float32"  # the KV's flag, not the weights'
    assert core.ctx.n_ctx == kv_cells(core.model, 1.0, "float32") == core.info.kv_capacity_tokens
    assert core.info.name == "served" and core.info.max_context_tokens == 1000
    assert core.prefix_cache is False and core.cache.park_budget == 2**28
    asyncio.run(engine.close())


def test_a_context_longer_than_the_pool_is_refused_at_start(capsys):
    # SmolLM2 with float32 KV: 46,080 bytes per cell, so a 256 MiB pool (the old default) holds
    # 5,632 cells; --context-length 8192 used to be served as 5,632 tokens without a word.
    argv = ["--engine", "llamacpp", "--model-path", "smollm2-135m", "--context-length", "8192"]
    assert main([*argv, "--kv-cache-dtype", "float32", "--kv-budget-mb", "256"]) == 2
    assert "raise --kv-budget-mb to at least 360" in capsys.readouterr().err
    service = build_service(parse_args([*argv, "--kv-cache-dtype", "float32", "--kv-budget-mb", "360"]))
    info = service.engine.info
    assert info.max_context_tokens == 8192 and info.kv_capacity_tokens >= 8192
    asyncio.run(service.shutdown())


@pytest.mark.slow  # SmolLM2: ~12 s
def test_the_default_serves_the_whole_context_with_llamacpps_kv_dtype(caplog):
    """No --kv-budget-mb, no --kv-cache-dtype: float16 KV (llama.cpp's default, half the bytes),
    a pool sized from the machine for the model's whole context, said at start; the canary's
    tolerance follows the KV dtype, and a splice on that pool passes it."""
    from leyline_sdk.core.directives import Directive
    from leyline_server.contract.values import CacheScope, SpliceRequest
    from leyline_server.engines.config import CANARY_TOLERANCES
    from leyline_server.splice import splice

    with caplog.at_level("INFO", logger="leyline.engine"):
        service = build_service(parse_args(["--engine", "llamacpp", "--model-path", "smollm2-135m"]))
    core = service.engine.core
    assert core.kv_type == "float16" and core.canary_tolerance == CANARY_TOLERANCES["ggml"]["float16"]
    assert service.context_tokens == core.model.n_ctx_train == 8192 and core.ctx.n_ctx >= 2 * 8192
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV pool:"))
    assert f"KV pool: {core.ctx.n_ctx} tokens, 360 MiB, from the machine: 2 x the 8,192-token context" in line
    base = [(37 * i + 11) % 1000 + 7 for i in range(300)]
    scope = CacheScope(private="s")
    handle = core.prefill(base, scope).handle
    request = SpliceRequest([Directive(start=40, end=90, replacement=[101, 102, 103])])
    new, report = splice(core, handle, request)
    assert report.applied and report.canary == "passed", report
    core.release(new)
    results = _canaries(core)  # the conformance suite's cases, on float16 keys
    right = results.pop("right")
    assert right.ran and right.error < right.tolerance, right
    for case, result in results.items():  # wrong rows still fail by more than an order of magnitude
        assert result.ran and result.error > 10 * result.tolerance, (case, result)
    asyncio.run(service.shutdown())


def test_threads_and_flash_attention_reach_the_llamacpp_context():
    flags = ["--engine", "llamacpp", "--model-path", "tiny-gqa", "--preset-layers", "1", "--kv-budget-mb", "1"]
    cores = os.cpu_count() or 2
    cases = [
        ([], (cores, cores, False)),
        (["--threads", "1", "--threads-batch", "3"], (1, 3, False)),
        (["--flash-attn", "auto"], (cores, cores, None)),
        (["--flash-attn", "on"], (cores, cores, True)),
    ]
    for extra, want in cases:
        service = build_service(parse_args([*flags, *extra]))
        ctx = service.engine.core.ctx
        assert (llama_cpp.llama_n_threads(ctx.ptr), llama_cpp.llama_n_threads_batch(ctx.ptr)) == want[:2]  # llama.cpp's
        assert ctx.config.flash_attn is want[2]
        asyncio.run(service.shutdown())
