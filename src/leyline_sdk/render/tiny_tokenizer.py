"""Leyline's own small tokenizer: byte-level BPE with ChatML special tokens and a chat template.

Tests and the demo need a real tokenizer with a real chat template but cannot download one. This
module builds it deterministically from text generated here (no network, no external corpus) and
saves it as an ordinary tokenizer folder that ``transformers.AutoTokenizer.from_pretrained``
loads. A built copy ships in ``leyline_sdk/assets/tiny-tokenizer``; :func:`tiny_tokenizer_path`
returns it. Rebuild with ``python -m leyline_sdk.render.tiny_tokenizer OUT_DIR``.

The template is ChatML-style and renders system/user/assistant/tool messages, tool definitions
and assistant tool calls::

    <|im_start|>system\\n# Tools\\n<tools>\\n{tool json}\\n</tools><|im_end|>\\n   (only with tools)
    <|im_start|>user\\nHello<|im_end|>\\n
    <|im_start|>assistant\\ntext<tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n{result}<|im_end|>\\n
    <|im_start|>assistant\\n                                                  (generation prompt)
"""

from __future__ import annotations

import random
import sys
from importlib import resources
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tools>",
    "</tools>",
]
VOCAB_SIZE = 1024

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call.get('function') else call %}"
    '<tool_call>{"name": {{ fn[\'name\'] | tojson }}, "arguments": '
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}"
    "{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a an of to in is it that for on with as this be are was by or from at not but have "
    "file read write run test error fix bug line code function class return import def self "
    "value list dict string int float none true false open path data result output input tool "
    "call user assistant system message content name arguments stdout stderr exit status "
    "python pytest assert traceback module package install server cache token model request "
    "response session edit replace remove insert older turn stub evicted summary plan step "
    "directory src tests main json yaml config debug print log warning info failed passed ok "
    "please can you the next first then after before because so we I will now here there "
    "patch diff apply commit branch search grep find match pattern count size bytes lines"
).split()
_SYMBOLS = list("{}[]()<>:;,.=+-*/_'\"#@!?%&|\\^~`$ \n\t0123456789")


def _corpus(seed: int = 1234, lines: int = 4000) -> list[str]:
    """Deterministic training text: words, code-ish lines, JSON and numbers."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + ".")
        elif kind == 1:
            name = rng.choice(_WORDS)
            out.append(f"def {name}_{rng.choice(_WORDS)}(self, {rng.choice(_WORDS)}):\n    return {name}")
        elif kind == 2:
            out.append(
                '{"name": "%s", "arguments": {"path": "src/%s.py", "line": %d}}'  # noqa: UP031 (kept: the shipped tokenizer was trained on this exact text)
                % (rng.choice(_WORDS), rng.choice(_WORDS), rng.randint(0, 999))
            )
        else:
            out.append("".join(rng.choice(_SYMBOLS) for _ in range(rng.randint(5, 30))))
    return out


def build_tiny_tokenizer(out_dir: str | Path) -> Path:
    """Train the tokenizer deterministically and save it as a transformers tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def tiny_tokenizer_path() -> Path:
    """Folder of the tokenizer that ships with the SDK (loadable with ``AutoTokenizer``)."""
    return Path(str(resources.files("leyline_sdk.assets") / "tiny-tokenizer"))


def load_tiny_tokenizer():  # -> PreTrainedTokenizerFast (transformers is an optional extra)
    """Load the shipped tokenizer with ``transformers.AutoTokenizer``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_path()))


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else str(tiny_tokenizer_path())
    print(build_tiny_tokenizer(target))
