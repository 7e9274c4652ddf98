"""Building the llama.cpp engine from the CLI's model names, and the KV pool's size."""

from __future__ import annotations

import asyncio

import pytest

from leyline_server.cli import build_service, parse_args
from leyline_server.engines.llamacpp.lib import LlamaModel
from leyline_server.engines.llamacpp.loader import kv_cells, resolve_gguf
from leyline_server.models import find_smollm2_gguf


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
    assert info.engine == "llamacpp" and info.kv_capacity_tokens == 8192 and info.shiftable
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
