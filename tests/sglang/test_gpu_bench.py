"""The GPU benchmark's driver and table, run on CPU against the harness (SGLang's real cache classes).

``benchmarks/gpu/sglang_e2e.py`` needs a GPU for SGLang's model; its Engine-protocol part (the
conversation, the amortize and forget edits, the numbers it reports) runs here on the harness,
so the script's logic and its expected cached-token counts are checked before a GPU is lent.
"""

from __future__ import annotations

import sys
from pathlib import Path

from leyline_server.engines.sglang.launch import _model_info
from leyline_server.engines.sglang.serving import AsyncSGLangEngine
from tests.sglang.harness import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))

import report  # noqa: E402
import sglang_e2e  # noqa: E402


async def test_bench_driver_and_table_on_the_harness():
    rt = Runtime("mla", pool_tokens=9000)
    engine = AsyncSGLangEngine(rt, _model_info(rt.control("info", {}), "tiny"))
    runs = await sglang_e2e.run(engine, [96], warmup=32)
    amortize, forget = runs["96"]["amortize"], runs["96"]["forget"]
    assert amortize["applied"] and amortize["canary"] == "passed" and amortize["rotated"] > 0
    assert amortize["conversation_reused"] == amortize["conversation_expected"]
    assert amortize["next_cached"] == amortize["expected_cached"]
    assert forget["fallback"] is None and forget["rotated"] == 0 and forget["next_cached"] == forget["expected_cached"]
    await engine.close()
    rt.check()
    rows = report.e2e_rows({"startup_s": 1, "backend": "cpu", "runs": runs})
    assert "MISMATCH" not in report.table(rows) and "(ok)" in report.table(rows)


def test_rotate_table_reads_bench_rotate_lines():
    text = "| pool | tokens | impl | ms | ktok/s | GB/s | vs copy |\n" \
           "| --- | ---: | --- | ---: | ---: | ---: | ---: |\n" \
           "| mla-v2-lite | 8192 | copy | 1.00 | 100 | 100.0 | 1.00x |\n" \
           "| mla-v2-lite | 8192 | triton | 2.00 | 100 | 100.0 | 2.00x |\n"  # fmt: skip
    rows = report.rotate_rows(report.parse_rotate(text))
    assert rows == [["rotate_copy Triton vs copy, mla-v2-lite, 8k tokens",
                     "50% of copy bandwidth (2.00 ms vs 1.00 ms)", ">= 70%: BELOW TARGET"]]  # fmt: skip


def test_model_config_is_deepseek_v2_lite(tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(sglang_e2e.write_model(tmp_path))
    assert (config.model_type, config.num_hidden_layers, config.kv_lora_rank, config.qk_rope_head_dim) == (
        "deepseek_v2", 27, 512, 64,
    )  # fmt: skip
