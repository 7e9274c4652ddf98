"""The GGUF writer: llama.cpp runs the tiny transformers model as transformers does, tokenizers agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_server.engines.llamacpp.convert import permute_rope_rows
from leyline_server.engines.llamacpp.lib import LlamaModel
from tests.llamacpp.helpers import engine, hf_model, max_diff, prefill

TEXT = (
    "<|im_start|>user\nRead the file, then fix the bug: café ünïcode, tabs\tand  spaces.<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>{"name": "read"}</tool_call><|im_end|>\n' + "def main():\n    return 1\n" * 40
)


@pytest.mark.parametrize("layers", [1, 2])
def test_llamacpp_forward_equals_transformers(layers, tiny1, tiny2):
    path = {1: tiny1, 2: tiny2}[layers]
    ids = load_tiny_tokenizer()(TEXT, add_special_tokens=False)["input_ids"]
    eng = engine(path)
    logits = prefill(eng, ids)[1]
    eng.close()
    with torch.no_grad():
        ref = hf_model(layers)(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.abs(ref).max() > 1.0  # not a degenerate model
    assert max_diff(logits, ref) < 2e-4


def test_rope_permutation_is_the_half_split_to_interleaved_map():
    head_dim, heads = 8, 2
    w = np.arange(heads * head_dim, dtype=np.float32)[:, None].repeat(3, axis=1)
    out = permute_rope_rows(w, heads)[:, 0].reshape(heads, head_dim)
    # row 2i of llama.cpp's head is HF's row i, row 2i+1 is HF's row i + d/2
    assert out[0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7] and out[1].tolist() == [8, 12, 9, 13, 10, 14, 11, 15]


def test_tokenizers_agree(tiny1):
    ids = load_tiny_tokenizer()(TEXT, add_special_tokens=False)["input_ids"]
    model = LlamaModel(tiny1)
    assert model.tokenize(TEXT) == ids  # llama.cpp's own tokenization
    from_gguf = AutoTokenizer.from_pretrained(str(tiny1.parent), gguf_file=tiny1.name)
    assert from_gguf(TEXT, add_special_tokens=False)["input_ids"] == ids  # what the service renders with
    assert from_gguf.chat_template == load_tiny_tokenizer().chat_template
    assert b"".join(model.piece(t) for t in ids).decode() == TEXT
    model.close()
