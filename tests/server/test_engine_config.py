"""Every engine flag of the CLI reaches the engine, through one frozen :class:`EngineConfig`.

The keyword relay this replaced (CLI -> factory -> loader) once dropped ``--disable-prefix-cache``
without a word. These tests walk the CLI parser's ``model`` group, so a flag added there without
reaching the config fails here, and check on a built engine that each field took effect.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re

import pytest
import torch

from leyline_server.cli import build_parser, build_service, engine_config, main, parse_args
from leyline_server.engines.config import EngineConfig, context_window
from leyline_server.engines.embedded.pool import layout_from_config
from leyline_server.engines.factory import build_engine


def _model_group(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    group = next(g for g in parser._action_groups if g.title == "model")
    return list(group._group_actions)


def _non_default(action: argparse.Action) -> list[str]:
    """A command line setting ``action`` to something other than its default."""
    flag = action.option_strings[0]
    if action.nargs == 0:  # store_true
        return [flag]
    if action.choices:
        value = next(c for c in action.choices if c not in (action.default, "sglang"))  # sglang: its own venv
        return [flag, str(value)]
    if action.type is int:
        return [flag, str((action.default or 300) + 1)]
    if action.type is float:
        return [flag, "0.5" if action.default is None else str(action.default / 2)]
    return [flag, "tiny-gqa"]


def test_every_model_flag_changes_the_engine_config():
    parser = build_parser()
    actions = _model_group(parser)
    assert len(actions) >= 10  # the group holds the engine flags (a renamed group would pass vacuously)
    default = engine_config(parse_args([]))
    for action in actions:
        argv = _non_default(action)
        changed = engine_config(parse_args(argv))
        diff = {
            f.name for f in dataclasses.fields(EngineConfig) if getattr(changed, f.name) != getattr(default, f.name)
        }
        assert diff, f"{' '.join(argv)} does not reach EngineConfig"


def test_each_flag_lands_in_its_field():
    args = parse_args(
        ["--model-path", "tiny-gqa", "--served-model-name", "a", "--served-model-name", "b", "--engine", "llamacpp",
         "--dtype", "bfloat16", "--kv-cache-dtype", "float32", "--preset-layers", "3", "--context-length", "300",
         "--kv-budget-mb", "12",
         "--disable-prefix-cache", "--swap-space", "0.5", "--rotation-budget", "7", "--canary-tolerance", "0.01",
         "--chunked-prefill-size", "64", "--max-running-requests", "9", "--threads", "3", "--threads-batch", "5",
         "--flash-attn", "auto"]
    )  # fmt: skip
    assert engine_config(args) == EngineConfig(
        engine="llamacpp",
        model="tiny-gqa",
        served_name="a",
        dtype="bfloat16",
        kv_cache_dtype="float32",
        preset_layers=3,
        kv_budget_mb=12.0,
        context_length=300,
        prefix_cache=False,
        swap_space_gb=0.5,
        rotation_budget=7,
        canary_tolerance=0.01,
        chunked_prefill_size=64,
        max_running_requests=9,
        threads=3,
        threads_batch=5,
        flash_attn="auto",
    )
    fraction = engine_config(parse_args(["--mem-fraction-static", "0.01"]))
    assert fraction.kv_budget_mb is not None and fraction.kv_budget_mb > 0  # a share of the memory available
    assert fraction.kv_budget_from == "--mem-fraction-static"
    assert engine_config(parse_args([])).kv_budget_mb is None  # no flag: sized from the machine


def test_the_config_is_frozen_and_checked():
    config = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = "x"  # type: ignore[misc]
    for bad, flag in (({"swap_space_gb": -1}, "--swap-space"), ({"kv_budget_mb": 0}, "--kv-budget-mb"),
                      ({"dtype": "int8"}, "--dtype"), ({"engine": "vllm"}, "unknown engine"),
                      ({"kv_cache_dtype": "int8", "engine": "llamacpp"}, "--kv-cache-dtype"),
                      ({"kv_cache_dtype": "float16"}, "keeps its KV in the weights' dtype"),
                      ({"threads": 0}, "--threads"),
                      ({"flash_attn": "yes"}, "--flash-attn"), ({"threads_batch": -1}, "--threads-batch")):  # fmt: skip
        with pytest.raises(ValueError, match=flag):
            EngineConfig(**bad)


def test_the_embedded_engine_honours_every_field():
    config = EngineConfig(
        model="tiny-gqa",
        served_name="served",
        dtype="bfloat16",
        preset_layers=3,
        kv_budget_mb=2.0,
        context_length=300,
        prefix_cache=False,
        rotation_budget=5,
        canary_tolerance=0.25,
        chunked_prefill_size=32,
        max_running_requests=3,
    )
    engine, _ = build_engine(config)
    core = engine.core  # type: ignore[attr-defined]
    layout = layout_from_config(core.model.config)
    assert core.info.name == "served" and core.info.max_context_tokens == 300
    assert core.model.config.num_hidden_layers == 3 and layout.layers == 3
    assert core.pool.dtype == torch.bfloat16 and next(core.model.parameters()).dtype == torch.bfloat16
    assert core.pool.capacity == int(2.0 * 2**20) // layout.bytes_per_slot(torch.bfloat16)
    assert core.prefix_cache is False
    assert (core.rotation_budget, core.canary_tolerance) == (5, 0.25)
    scheduler = engine.scheduler  # type: ignore[attr-defined]
    assert (scheduler.chunk_size, scheduler.max_running) == (32, 3)
    asyncio.run(engine.close())


def test_the_canary_tolerance_defaults_by_kv_dtype_and_math():
    from leyline_server.engines.config import canary_tolerance

    assert canary_tolerance("torch", "torch.float32") == 1e-4 and canary_tolerance("ggml", "float32") == 2e-3
    assert canary_tolerance("torch", "float8") == 1e-2 and canary_tolerance("torch", "float32", 0.5) == 0.5


def test_the_cli_reaches_the_embedded_engine():
    argv = ["--model-path", "tiny-gqa", "--served-model-name", "m", "--preset-layers", "1", "--kv-budget-mb", "4",
            "--context-length", "256", "--disable-prefix-cache", "--dtype", "float16"]  # fmt: skip
    service = build_service(parse_args(argv))
    core = service.engine.core
    assert (core.info.name, core.info.max_context_tokens, core.prefix_cache) == ("m", 256, False)
    assert core.pool.dtype == torch.float16 and core.model.config.num_hidden_layers == 1
    asyncio.run(service.shutdown())


def test_a_context_the_pool_cannot_hold_is_refused_naming_the_budget():
    small = EngineConfig(model="tiny-gqa", preset_layers=1, kv_budget_mb=0.05)
    engine, _ = build_engine(small)
    capacity = engine.info.kv_capacity_tokens
    assert engine.info.max_context_tokens == capacity  # no --context-length: the pool caps it
    asyncio.run(engine.close())
    asked = capacity + 100
    with pytest.raises(ValueError, match="--kv-budget-mb") as refused:
        build_engine(dataclasses.replace(small, context_length=asked))
    need = int(re.search(r"--kv-budget-mb to at least (\d+)", str(refused.value)).group(1))
    engine, _ = build_engine(dataclasses.replace(small, context_length=asked, kv_budget_mb=need))
    assert engine.info.max_context_tokens == asked  # the budget the message names is enough
    asyncio.run(engine.close())
    with pytest.raises(ValueError, match="longer than the model's context of 8192"):
        build_engine(dataclasses.replace(small, context_length=9000, kv_budget_mb=64))


def test_main_refuses_to_start_with_an_impossible_context(capsys):
    assert main(["--model-path", "tiny-gqa", "--preset-layers", "1", "--kv-budget-mb", "0.05",
                 "--context-length", "4096"]) == 2  # fmt: skip
    assert "--kv-budget-mb" in capsys.readouterr().err


def test_context_window_rounds_the_budget_to_the_pool_granule():
    assert context_window(None, 8192, 5632, 46080, granule=256) == 5632
    assert context_window(4096, 8192, 5632, 46080, granule=256) == 4096
    with pytest.raises(ValueError, match="at least 360 "):  # 8192 cells x 46,080 bytes = 360 MiB
        context_window(8192, 8192, 5632, 46080, granule=256)


def test_the_kv_cache_dtype_is_its_own_flag_auto_being_float16_on_llamacpp():
    assert EngineConfig(engine="llamacpp").kv_dtype == "float16"  # llama.cpp's own default
    assert EngineConfig(engine="llamacpp", dtype="float32", kv_cache_dtype="float32").kv_dtype == "float32"
    assert EngineConfig(dtype="bfloat16").kv_dtype == "bfloat16"  # embedded: the weights' dtype
    args = parse_args(["--engine", "sglang", "--kv-cache-dtype", "fp8_e4m3"]) if _has_sglang() else None
    if args is not None:  # SGLang's own values pass through to it
        assert args.engine_args[-2:] == ["--kv-cache-dtype", "fp8_e4m3"]


def _has_sglang() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


def test_the_default_pool_holds_the_served_context_twice_within_half_the_machine():
    from leyline_server.engines.kv_budget import FLOOR_MB, machine_budget

    mib, gib = 2**20, 2**30
    # SmolLM2 on the embedded engine: 46,080 bytes a token, 8,192 tokens = 360 MiB; 720 MiB for two
    roomy = machine_budget(8192, 46_080, 16 * gib, asked=True)
    assert roomy.mb == 720 and "2 x the 8,192-token context" in roomy.source
    assert machine_budget(1000, 512, 16 * gib, asked=False).mb == FLOOR_MB  # a small model: the floor
    tight = machine_budget(8192, 46_080, 1 * gib, asked=True)  # half the machine: 512 MiB, one context fits
    assert tight.mb == 512 and "0.5 of the memory available" in tight.source
    with pytest.raises(ValueError, match=r"--context-length 32768 needs a KV pool of 1,440 MiB .* 512 MiB"):
        machine_budget(32768, 46_080, 1 * gib, asked=True)  # even the machine cannot hold it: said clearly
    capped = machine_budget(32768, 46_080, 1 * gib, asked=False)  # the model's own context: capped by the pool
    assert capped.mb == 512
    cells = machine_budget(1000, 23_040, 16 * gib, asked=True, granule=256)  # llama.cpp grows in 256 cells
    assert cells.mb * mib >= 2 * 1024 * 23_040 - 1 and cells.mb == FLOOR_MB


@pytest.mark.slow  # SmolLM2 and a 720 MiB pool: ~25 s
def test_smollm2_starts_with_its_whole_context_without_a_budget(caplog):
    # the old fixed default (256 MiB) held 5,632 of SmolLM2's 8,192 tokens in float32
    with caplog.at_level("INFO", logger="leyline.engine"):
        service = build_service(parse_args(["--model-path", "smollm2-135m", "--context-length", "8192"]))
    info = service.engine.info
    assert info.max_context_tokens == 8192 and info.kv_capacity_tokens >= 2 * 8192
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV pool:"))
    assert line.startswith(f"KV pool: {info.kv_capacity_tokens} tokens, 720 MiB, from the machine"), line
    asyncio.run(service.shutdown())
