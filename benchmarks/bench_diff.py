"""Render + diff of a 500-message, ~100k-token tool-heavy conversation with one edited message.

Reports the rendering cost (the chat template and the tokenizer: paid by whoever renders) apart
from the diff itself (``diff_to_directives``: cell matching, trimming and the exact verification),
and what rendering the edited conversation costs an ``IncrementalRenderer`` that rendered the
original already (a session's next turn).

    python benchmarks/bench_diff.py [--messages 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from leyline_sdk.core.directives import apply
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.render.incremental import IncrementalRenderer
from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer

WORDS = "def return import file line error test value path result output self class data".split()


def tool_heavy_conversation(n_messages: int, seed: int = 0) -> list[dict]:
    """system, then repeating user / assistant(tool call) / tool(output) / assistant turns."""
    rng = random.Random(seed)
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    i = 0
    while len(messages) < n_messages:
        messages.append({"role": "user", "content": f"step {i}: inspect src/mod_{i}.py"})
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod_{i}.py"})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(56))
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": body})
        messages.append({"role": "assistant", "content": f"mod_{i} looks fine."})
        i += 1
    return messages[:n_messages]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    chat = HFChatTokenizer(load_tiny_tokenizer())
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    old_messages = tool_heavy_conversation(args.messages)
    tool_idx = next(i for i, m in enumerate(old_messages) if m["role"] == "tool" and i > args.messages // 3)
    new_messages = list(old_messages)
    new_messages[tool_idx] = {
        **old_messages[tool_idx],
        "content": "[evicted: read_file output, 56 lines]",
    }

    render_times, incremental_times, diff_times = [], [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        old = chat.render(old_messages, tools=tools)
        new = chat.render(new_messages, tools=tools)
        t1 = time.perf_counter()
        directives = diff_to_directives(old, new)
        t2 = time.perf_counter()
        render_times.append((t1 - t0) / 2)
        diff_times.append(t2 - t1)
        incremental = IncrementalRenderer(chat)
        incremental.render(old_messages, tools=tools)
        t3 = time.perf_counter()
        again = incremental.render(new_messages, tools=tools)
        incremental_times.append(time.perf_counter() - t3)
        assert again == new and incremental.incremental_renders == 1
    assert apply(old.tokens, directives) == new.tokens
    n = len(old.tokens)
    render_ms = statistics.median(render_times) * 1e3
    diff_ms = statistics.median(diff_times) * 1e3
    incremental_ms = statistics.median(incremental_times) * 1e3
    print(
        f"messages={len(old_messages)} tokens={n} directives={len(directives)} "
        f"removed={sum(d.end - d.start for d in directives)} inserted={sum(len(d.replacement) for d in directives)}"
    )
    print("\n| step | time | throughput |\n| --- | ---: | ---: |")
    print(f"| full render (template for every message prefix + tokenizer) | {render_ms:,.1f} ms | "
          f"{n / render_ms * 1e3:,.0f} tok/s |")  # fmt: skip
    print(f"| incremental re-render, one message edited | {incremental_ms:,.1f} ms | |")
    print(f"| `diff_to_directives` incl. verification | {diff_ms:,.1f} ms | {2 * n / diff_ms * 1e3:,.0f} tok/s |")
    print(f"\ntarget diff < 50 ms: {'PASS' if diff_ms < 50 else 'MISS'}")


if __name__ == "__main__":
    main()
