"""A sliding-window model spliced: Gemma 3 270M on the embedded engine, splice vs forget vs full.

    .venv/bin/leyline-models fetch gemma3-270m
    .venv/bin/python benchmarks/bench_windowed.py [--downstream 4096 16384] [--conversations 16]

Gemma 3 270M (the pretrained model, Q4_K_M GGUF dequantized to fp32): 18 layers, 5 local ones
(512-position window, RoPE base 10k) to each global one (base 1M). The embedded engine keeps every
row of the local layers and rotates each layer with its own base.

* **Time**: a session holds ``head (256) | tool output (1,024) | downstream (D)``; the output is
  replaced by a 16-token stub and a 32-token turn follows. From the edit to the turn's next-token
  logits: ``splice`` (amortize: the stub prefilled, D rotated) against ``forget`` (stub and D
  prefilled again); and whether their first tokens agree.
* **Agreement**: the agreement benchmark's agent conversations (``bench_agreement.main_set``: one
  old tool output stubbed, a question), first-token and 32-token agreement of splice, forget and
  full. The GGUF carries no chat template (a pretrained model): Gemma's turn format is used.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_agreement import Arms, main_set  # noqa: E402

from leyline_sdk.core.directives import Directive, apply  # noqa: E402
from leyline_sdk.render.rendering import HFChatTokenizer  # noqa: E402
from leyline_server.contract.values import CacheScope, SpliceRequest  # noqa: E402
from leyline_server.engines.config import EngineConfig  # noqa: E402
from leyline_server.engines.embedded.presets import load_engine  # noqa: E402
from leyline_server.splice import splice  # noqa: E402

SESSION = CacheScope(private="bench")
CHUNK = 2048  # the session is prefilled in pieces, as the scheduler's chunked prefill would
# Gemma's turn format (its instruction-tuned models' template, without the system-turn folding)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def session(engine, tokens: list[int]):
    """``tokens`` cached in the bench scope, prefilled ``CHUNK`` at a time."""
    handle = None
    for end in range(min(CHUNK, len(tokens)), len(tokens) + CHUNK, CHUNK):
        handle = engine.prefill(tokens[: min(end, len(tokens))], SESSION, previous=handle).handle
    return handle


def timed_edit(engine, base: list[int], stub: list[int], turn: list[int], mode: str):
    """(seconds from the edit to the turn's logits, those logits, the splice report)."""
    handle = session(engine, base)
    directive = [Directive(start=256, end=256 + 1024, replacement=stub, mode=mode)]
    start = time.perf_counter()
    handle, report = splice(engine, handle, SpliceRequest(directive))
    result = engine.prefill(apply(base, directive) + turn, SESSION, previous=handle)
    seconds = time.perf_counter() - start
    engine.release(result.handle)
    engine.pool.free(engine.radix.evict(engine.pool.capacity))  # the next run starts from an empty cache
    return seconds, result.last_logits, report


def time_table(engine, downstream: list[int]) -> None:
    """Print splice vs forget at each downstream length."""
    print("| downstream | splice | forget | forget / splice | rotated | first token same |")
    print("| ---: | ---: | ---: | ---: | ---: | :---: |")
    span = min(engine.info.vocab_size - 100, 20000)  # token ids from the vocabulary's ordinary part
    for d in downstream:
        base = [(31 * i + 7) % span + 50 for i in range(256 + 1024 + d)]
        turn, stub = [(13 * i + 5) % span + 50 for i in range(32)], list(range(60, 76))
        s_time, s_logits, report = timed_edit(engine, base, stub, turn, "amortize")
        f_time, f_logits, _ = timed_edit(engine, base, stub, turn, "forget")
        assert report.applied and report.canary == "passed", report
        same = "yes" if int(s_logits.argmax()) == int(f_logits.argmax()) else "no"
        cells = f"{s_time:.2f} s | {f_time:.2f} s | {f_time / s_time:.1f}x | {report.rotated_tokens:,} | {same}"
        print(f"| {d:,} | {cells} |", flush=True)


def main() -> None:
    """Load Gemma 3 270M, print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--downstream", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--model", default="gemma3-270m", help="tiny-gemma3: the tiny preset (a smoke run)")
    parser.add_argument("--context-length", type=int, default=20480)
    args = parser.parse_args()
    torch.set_num_threads(2)
    began = time.perf_counter()
    config = EngineConfig(model=args.model, kv_budget_mb=1536, context_length=args.context_length)
    engine, tokenizer = load_engine(config)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = GEMMA_TEMPLATE
    windows = sorted({w for w in engine.spec.windows if w}) or ["none"]
    loaded = time.perf_counter() - began
    print(f"{args.model}, embedded engine, fp32, 2 cores; local windows {windows}; loaded in {loaded:.0f} s\n")
    time_table(engine, args.downstream)
    if args.conversations:
        result = main_set(Arms(engine, HFChatTokenizer(tokenizer), greedy=32), args.conversations)
        print(f"\n{args.conversations} agent conversations, one old output stubbed, then a question\n")
        print("| pair | first-token agreement | greedy 32-token agreement | KL | logit cosine |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for pair in ("splice~full", "splice~forget", "forget~full"):
            m = result[pair]
            cells = f"{m['first']:.0%} | {m['greedy']:.0%} | {m['kl']:.4f} | {m['cos']:.4f}"
            print(f"| {pair.replace('~', ' vs ')} | {cells} |")
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
