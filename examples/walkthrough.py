"""Walk-through of Leyline's edit path: render a conversation, edit it, derive and verify directives.

    python examples/walkthrough.py

An agent replaces an old tool output with a stub and redacts a secret. Leyline renders both
histories with the model's chat template, diffs them per message and prints the token-span
directives the server would apply (``amortize`` splices, ``forget`` recomputes), then checks
``apply(old_tokens, directives) == new_tokens``. Finally the embedded engine (a tiny random
DeepSeek-V2-style MLA model, no download) applies the same edits to a real KV cache: once as an
``amortize`` splice (stub only) and once with the redaction's ``forget``, and reports reused,
rotated and prefilled tokens.
"""

from __future__ import annotations

import json

from leyline_sdk.core.directives import Mode, apply, digest, position_map
from leyline_sdk.explain.diff import diff_to_directives
from leyline_sdk.render.rendering import HFChatTokenizer
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
from leyline_server.contract.values import CacheScope, SpliceRequest
from leyline_server.engines.config import EngineConfig
from leyline_server.engines.embedded.presets import load_engine
from leyline_server.splice import splice


def conversation() -> list[dict]:
    listing = "\n".join(f"src/module_{i}.py  {120 + 7 * i} lines" for i in range(30))
    return [
        {"role": "system", "content": "You are a coding agent. Use tools."},
        {"role": "user", "content": "Find the failing test. My token is sk-12345."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run", "arguments": json.dumps({"cmd": "ls -l src"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": listing},
        {"role": "assistant", "content": "Thirty modules. Running the tests next."},
        {"role": "user", "content": "Go ahead."},
    ]


def main() -> None:
    chat = HFChatTokenizer(load_tiny_tokenizer())
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    old_messages = conversation()
    new_messages = [dict(m) for m in old_messages]
    new_messages[3]["content"] = "[evicted: run(ls -l src), 30 lines]"  # stale tool output
    new_messages[1]["content"] = "Find the failing test. My token is [redacted]."  # must be forgotten

    old = chat.render(old_messages, tools=tools)
    new = chat.render(new_messages, tools=tools)
    print(f"old prompt: {len(old.tokens)} tokens, digest {digest(old.tokens)}")
    print(f"new prompt: {len(new.tokens)} tokens, digest {digest(new.tokens)}")
    print("message spans (old):", [(s.start, s.end) for s in old.message_spans])

    directives = diff_to_directives(old, new, modes={1: Mode.FORGET})
    print("\ndirectives:")
    tok = chat.tokenizer
    for d in directives:
        print(
            f"  [{d.start:4d}, {d.end:4d}) -> {len(d.replacement):3d} tokens  mode={d.mode.value:8s} "
            f"removed={tok.decode(old.tokens[d.start : d.end])[:40]!r}  replacement={tok.decode(list(d.replacement))!r}"
        )

    result = apply(old.tokens, directives)
    assert result == new.tokens, "directives must reproduce the new prompt exactly"
    moved = position_map(len(old.tokens), directives)
    last = len(old.tokens) - 1
    print(f"\nverified: apply(old, directives) == new ({len(result)} tokens)")
    print(f"the last old token moves {last} -> {moved[last]} (its key gets a RoPE δ-rotation of {moved[last] - last})")
    first_forget = min((d.start for d in directives if d.mode is Mode.FORGET), default=None)
    if first_forget is not None:
        print(f"a forget directive starts at {first_forget}: the server recomputes everything from there")

    print("\nembedded engine (tiny-mla, 4 layers, CPU):")
    stub_only = [d for d in directives if d.mode is Mode.AMORTIZE]
    for label, ds in (("stub (amortize)", stub_only), ("stub + redaction (forget)", directives)):
        engine, _ = load_engine(EngineConfig(model="tiny-mla", kv_budget_mb=16, preset_layers=4))
        session = CacheScope(private="walkthrough")  # rotated KV is private to the session that asked
        pinned = engine.prefill(old.tokens, session).handle
        pinned, report = splice(engine, pinned, SpliceRequest(ds))
        engine.check_integrity()
        assert pinned.tokens == apply(old.tokens, ds)
        print(
            f"  {label:26s} applied={report.applied} reused={report.reused_tokens:4d} "
            f"rotated={report.rotated_tokens:4d} prefilled={report.prefilled_tokens:4d} "
            f"time={report.splice_ms:6.1f} ms"
        )


if __name__ == "__main__":
    main()
