"""The plugin's plumbing and the launch's refusals, against SGLang's real classes and parser (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from leyline_server.engines.sglang.launch import REFUSED, check_server_args, sglang_argv
from tests.sglang.harness import Runtime, rotary_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 4096, "rms_norm_eps": 1e-6}  # fmt: skip
# each refused field, and a command line that sets it
REFUSED_ARGS = {
    "page_size": ["--page-size", "16"],
    "enable_hierarchical_cache": ["--enable-hicache"],
    "hicache_storage_backend": ["--hicache-storage-backend", "file"],
    "enable_lmcache": ["--enable-lmcache"],
    "enable_flexkv": ["--enable-flexkv"],
    "enable_unified_cache_external_linker": ["--enable-unified-cache-external-linker"],
    "enable_hisparse": ["--enable-hisparse"],
    "speculative_algorithm": ["--speculative-algorithm", "NGRAM"],
    "enable_dp_attention": ["--enable-dp-attention"],
    "attn_dp_size": ["--attn-dp-size", "2"],
    "dp_size": ["--dp-size", "2"],
    "pp_size": ["--pp-size", "2"],
    "dcp_size": ["--dcp-size", "2"],
    "enable_kv_cache_sharding": ["--enable-kv-cache-sharding"],
    "enable_prefill_cp": ["--enable-prefill-cp"],
    "disable_radix_cache": ["--disable-radix-cache"],
    "kv_cache_dtype": ["--kv-cache-dtype", "fp8_e4m3"],
    "enable_unified_memory": ["--enable-unified-memory"],
    "enable_page_major_kv_layout": ["--enable-page-major-kv-layout"],
    "enable_streaming_session": ["--enable-streaming-session"],
    "enable_session_radix_cache": ["--enable-session-radix-cache"],
    "radix_cache_backend": ["--radix-cache-backend", "mine"],
    "tokenizer_worker_num": ["--tokenizer-worker-num", "2"],
    "disaggregation_mode": ["--disaggregation-mode", "prefill"],
    "nnodes": ["--nnodes", "2"],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def _parse(model_dir: Path, extra: list[str]):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", str(model_dir), *extra])


def test_every_refused_field_has_a_case():
    assert set(REFUSED_ARGS) == set(REFUSED)


@pytest.mark.parametrize("field", sorted(REFUSED_ARGS))
def test_each_unsupported_flag_is_refused_by_name(field, model_dir):
    argv = REFUSED_ARGS[field]
    try:
        args = _parse(model_dir, argv)
    except SystemExit:  # SGLang's own parser rejected the value; set the field as SGLang would
        args = _parse(model_dir, [])
        object.__setattr__(args, field, argv[-1])
    reasons = check_server_args(args)
    assert len(reasons) == 1 and argv[0] in reasons[0], reasons


def test_supported_flags_pass(model_dir, monkeypatch):
    monkeypatch.delenv("SGLANG_USE_HND_KVCACHE", raising=False)
    args = _parse(
        model_dir, ["--page-size", "1", "--tp-size", "2", "--kv-cache-dtype", "bf16", "--load-format", "dummy"]
    )
    assert check_server_args(args) == []
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    assert "SGLANG_USE_HND_KVCACHE" in check_server_args(args)[0]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "leyline_server.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip


def test_cli_help_shows_leyline_and_sglang_flags():
    out = _cli("--engine", "sglang", "--help")
    assert out.returncode == 0, out.stderr
    assert "--kv-budget-mb" in out.stdout and "--page-size" in out.stdout and "--tp-size" in out.stdout


def test_cli_refuses_an_unsupported_flag_by_name(model_dir):
    out = _cli("--engine", "sglang", "--model-path", str(model_dir), "--page-size", "16")
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]  # SGLang warns about the missing GPU on import
    assert last.startswith("leyline-server: the sglang engine cannot run with:") and "--page-size 16" in last


def test_cli_passes_sglang_flags_through():
    from leyline_server.cli import parse_args

    args = parse_args(["--engine", "sglang", "--model-path", "m", "--port", "9001", "--tp-size", "2",
                       "--context-length", "4096", "--dtype", "bfloat16", "--attention-backend", "fa3"])  # fmt: skip
    assert args.port == 9001 and args.model == "m"
    assert args.engine_args == ["--model-path", "m", "--context-length", "4096", "--dtype", "bfloat16",
                                "--tp-size", "2", "--attention-backend", "fa3"]  # fmt: skip
    assert parse_args(["--engine", "sglang", "--model-path", "m"]).engine_args == sglang_argv("m", [], None, None, None)


def test_hook_is_installed_on_sglangs_scheduler():
    from sglang.srt.managers.scheduler import Scheduler

    Runtime("mha", pool_tokens=32)
    assert hasattr(Scheduler.init_request_dispatcher, "__wrapped__")


def test_unknown_ops_and_pins_are_errors_not_crashes():
    from leyline_server.engines.sglang.backend import ControlError

    rt = Runtime("mha", pool_tokens=32)
    with pytest.raises(ControlError, match="unknown_op"):
        rt.control("nope", {})
    with pytest.raises(ControlError, match="unknown_pin"):
        rt.control("counts", {"pin": 99, "positions": [0]})
    rt.control("unpin", {"pin": 99})  # releasing twice is harmless
    rt.check()


def test_runtime_refusals_read_what_sglang_built():
    from leyline_server.engines.sglang.runtime import scheduler_refusals

    rt = Runtime("mha", pool_tokens=32)
    assert scheduler_refusals(rt.scheduler) == []
    rt.scheduler.page_size = 64
    rt.scheduler.spec_algorithm.is_none = lambda: False
    reasons = scheduler_refusals(rt.scheduler)
    assert any("page size 64" in r for r in reasons) and any("speculative" in r for r in reasons)


def test_rope_spec_from_sglang_rotary_classes():
    from leyline_server.engines.sglang.rotary import rope_spec_from_rotary
    from leyline_server.rope import rope_spec_from_config
    from leyline_server.tiny_models import LLAMA3, tiny_config

    config = tiny_config("llama", rope=LLAMA3)
    scaling = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    spec = rope_spec_from_rotary(rotary_for(config, "mha", scaling), 0, "llama")
    hf = rope_spec_from_config(config)
    assert spec.shiftable and spec.layout == hf.layout == "half_split"
    assert spec.inv_freq == pytest.approx(hf.inv_freq, rel=1e-6)
    dynamic = rope_spec_from_rotary(rotary_for(config, "mha", {"rope_type": "dynamic", "factor": 2.0}), 0, "llama")
    assert not dynamic.shiftable and "DynamicNTKScalingRotaryEmbedding" in dynamic.reason
    assert not rope_spec_from_rotary(None, 0, "x").shiftable


def test_a_model_whose_layers_rotate_differently_is_found():
    """Gemma 3's shape: SGLang builds each layer's own rotary module (local base 10k, global 1M);
    the spec reads layer 0's, so a model whose layers differ must be refused, not rotated wrong."""
    from types import SimpleNamespace

    from leyline_server.engines.sglang.rotary import first_differing_layer
    from leyline_server.tiny_models import tiny_config

    local = rotary_for(tiny_config("llama"), "mha")
    wide = rotary_for(tiny_config("llama", rope={"rope_type": "default", "rope_theta": 1e6}), "mha")

    def model(*rotaries):
        layers = [SimpleNamespace(self_attn=SimpleNamespace(rotary_emb=r)) for r in rotaries]
        return SimpleNamespace(model=SimpleNamespace(layers=layers))

    assert first_differing_layer(model(local, local, rotary_for(tiny_config("llama"), "mha"))) is None
    assert first_differing_layer(model(local, local, local, local, local, wide)) == 5
