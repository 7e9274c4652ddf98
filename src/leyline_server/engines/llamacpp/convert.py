"""Write a llama-style transformers model and a byte-level BPE tokenizer as a GGUF file (no llama.cpp script).

The llama.cpp engine serves GGUF files only; tests, the demo and the benchmarks need the
project's tiny random models there too, so that both engines serve *the same weights*. This is
a small, self-contained writer for ``LlamaForCausalLM`` (the ``tiny-gqa`` preset, or
``tiny_config("llama", layers=1)``) with the ``gguf`` package:

* hyperparameters under ``llama.*``, tensors renamed to llama.cpp's names;
* ``attn_q``/``attn_k`` rows permuted from the half-split RoPE layout transformers uses to the
  interleaved pairs llama.cpp's llama architecture expects (its ``LLAMA_ROPE_TYPE_NORM``);
* the tokenizer as ``gpt2`` BPE with the ``gpt-2`` pre-tokenizer (HF ``ByteLevel(use_regex=True)``),
  special added tokens as CONTROL, merges, EOS/PAD ids and the chat template.

Weights are written in float32, so a llama.cpp forward equals the transformers forward to ~1e-5.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_llama_gguf", "preset_gguf", "permute_rope_rows"]

_LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def permute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection from half-split pairs ``(i, i + d/2)`` to interleaved ``(2i, 2i+1)``."""
    out = weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
    return out.swapaxes(1, 2).reshape(weight.shape)


def _tensors(model: Any) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) for every weight of a ``LlamaForCausalLM``."""
    config = model.config
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    out = [
        ("token_embd.weight", state["model.embed_tokens.weight"]),
        ("output_norm.weight", state["model.norm.weight"]),
        ("output.weight", state.get("lm_head.weight", state["model.embed_tokens.weight"])),
    ]
    for i in range(config.num_hidden_layers):
        for hf, name in _LAYER_TENSORS.items():
            weight = state[f"model.layers.{i}.{hf}.weight"]
            if name == "attn_q":
                weight = permute_rope_rows(weight, config.num_attention_heads)
            elif name == "attn_k":
                weight = permute_rope_rows(weight, config.num_key_value_heads)
            out.append((f"blk.{i}.{name}.weight", np.ascontiguousarray(weight, dtype=np.float32)))
    return out


def _vocab(tokenizer_json: dict[str, Any], vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE ``tokenizer.json``."""
    import gguf

    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"only byte-level BPE tokenizers are supported, not {model.get('type')!r}")
    by_id = {i: tok for tok, i in model["vocab"].items()}
    special = {t["id"]: t for t in tokenizer_json.get("added_tokens", [])}
    for i, t in special.items():
        by_id[i] = t["content"]
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        tokens.append(by_id[i])
        added = special.get(i)
        if added is None:
            types.append(int(gguf.TokenType.NORMAL))
        else:
            types.append(int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def write_llama_gguf(model: Any, tokenizer_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Write ``model`` (a transformers ``LlamaForCausalLM``) and the tokenizer in ``tokenizer_dir`` to ``path``."""
    import gguf

    config = model.config
    if config.model_type != "llama":
        raise ValueError(f"only llama models are written, not {config.model_type!r}")
    tok_dir = Path(tokenizer_dir)
    tokenizer_json = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tok_config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokens, types, merges = _vocab(tokenizer_json, config.vocab_size)
    ids = {t: i for i, t in enumerate(tokens)}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        raise ValueError("only unscaled RoPE is written")

    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(getattr(config, "name_or_path", "") or "leyline-tiny-llama")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    writer.add_key_length(int(head_dim))
    writer.add_value_length(int(head_dim))
    writer.add_rope_dimension_count(int(head_dim))
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_add_bos_token(False)
    for key, add in (("eos_token", writer.add_eos_token_id), ("pad_token", writer.add_pad_token_id)):
        if tok_config.get(key) in ids:
            add(ids[tok_config[key]])
    template = tok_dir / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text(encoding="utf-8"))
    for name, array in _tensors(model):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def preset_gguf(name: str, layers: int = 2, seed: int = 0, directory: str | None = None) -> Path:
    """The GGUF of a llama-style embedded preset (``tiny-gqa``) with the project's tiny tokenizer.

    Built from the same config and seed as the embedded engine's preset, so both engines serve
    the same weights; written (atomically) under ``directory`` (default: the temp dir).
    """
    import torch

    from leyline_sdk.render.tiny_tokenizer import tiny_tokenizer_path
    from leyline_server.tiny_models import build_model, preset_config

    config = preset_config(name, layers=layers)
    if config.model_type != "llama":
        raise ValueError(f"the llama.cpp engine serves llama-style presets only; {name!r} is {config.model_type}")
    folder = Path(directory or Path(tempfile.gettempdir()) / "leyline-gguf")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-{layers}l-seed{seed}.gguf"
    model = build_model(config, seed=seed, dtype=torch.float32)
    fd, tmp = tempfile.mkstemp(suffix=".gguf", dir=folder)
    os.close(fd)
    try:
        write_llama_gguf(model, tiny_tokenizer_path(), tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
