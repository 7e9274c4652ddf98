"""Claude Code's default first request on a real model: cold, then as a new conversation.

    .venv/bin/python benchmarks/bench_claude_code_first.py [--model qwen2.5-coder-0.5b]

Claude Code 2.1.197 (``make agents``) with its default tools sends a first request of ~18.8k
tokens (its system prompt and 24 tools). Step one captures that request as the real CLI sends it
(``claude -p`` against a server on the tiny long-context preset, which answers in seconds). Step
two posts it, streamed, to a fresh server on ``--model`` (the llama.cpp engine, 32k context) the
way Claude Code does, twice:

* **cold** — the first conversation on a fresh server: everything is prefilled (sent with the
  opt-in below, as a user who set ``ANTHROPIC_CUSTOM_HEADERS`` sends every request: a new
  conversation's prefill is the same with or without it, and its session is then there to reuse);
* **new conversation** — the same request with another first prompt and another attribution
  suffix (``x-anthropic-billing-header: cc_version=…``, which Claude Code derives from the first
  prompt): what a user's second ``claude`` run sends. The server drops the attribution line as
  volatile (``docs/messages.md``), so the system prompt and tools come from the cache.
* **another folder** — a new conversation started in another working directory, which Claude
  Code names inside its system prompt: the prefix cache stops there and the rest (most of the
  system prompt's end and the tools) is prefilled;
* **another folder, opt-in** — the same with ``X-Leyline-Client-Edits: amortize``
  (``ANTHROPIC_CUSTOM_HEADERS``): the new conversation opens on the cached tokens and splices the
  folder's name (conversation rule 4, ``docs/server.md``); the rest is rotated into place.

Measured on the client: the time to the first byte (the stream's ``message_start``, sent at once
so Claude Code's 300 s read timeout never fires) and to the first text token, and the prompt
tokens read from the cache (``cache_read_input_tokens`` of the closing ``message_delta``). Writes
``docs/results/tables/claude_code_first.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recorded_bodies import recorded_bodies  # noqa: E402

from leyline_server.api.messages_api import inputs  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402
from tests.agents.clients import RefusingProxy, claude  # noqa: E402

LINE = re.compile(r"(x-anthropic-billing-header: cc_version=[\d.]+\.)(\w+)(;)")


def capture() -> dict[str, Any]:
    """Claude Code's first request with its default tools, as the server received it."""
    service = local_service("tiny-gqa-long", engine="llamacpp", kv_budget_mb=512, max_context_tokens=65536)
    proxy = RefusingProxy()
    try:
        with recorded_bodies(inputs) as bodies, serve_in_thread(service) as url, tempfile.TemporaryDirectory() as home:
            done = claude(Path(home), url, "tiny-gqa-long", "Which files are in this folder?", proxy, max_output=16)
            if done.returncode != 0:
                raise SystemExit(f"claude -p failed: {done.stderr[-2000:]}")
    finally:
        proxy.close()
    return max(bodies, key=lambda b: len(json.dumps(b)))  # the turn itself, not a title or quota probe


def another_conversation(body: dict[str, Any]) -> dict[str, Any]:
    """The same request as a new conversation: another first prompt and another attribution suffix."""
    text = json.dumps(body)
    text, swapped = LINE.subn(lambda m: m.group(1) + "a91" + m.group(3), text)
    assert swapped, "no attribution line in the captured request"
    text = text.replace("Which files are in this folder?", "Explain what this project does.")
    return json.loads(text)


def another_folder(body: dict[str, Any], folder: str) -> dict[str, Any]:
    """The request as a new conversation (:func:`another_conversation`) in working directory ``folder``."""
    text = json.dumps(another_conversation(body))
    cwd = re.search(r"Primary working directory: ([^\\\s]+)", text) or re.search(r"Working directory: ([^\\\s]+)", text)
    assert cwd, "no working directory in the captured request"
    return json.loads(text.replace(cwd.group(1), folder))


def measure(url: str, model: str, body: dict[str, Any], opt_in: bool = False) -> dict[str, float]:
    """Post ``body`` streamed; seconds to the first byte and the first text token, tokens read from cache."""
    body = {**body, "model": model, "stream": True, "max_tokens": 8, "temperature": 0}
    start = time.perf_counter()
    first_byte = first_token = None
    usage: dict[str, Any] = {}
    headers = {"x-api-key": "x", **({"X-Leyline-Client-Edits": "amortize"} if opt_in else {})}
    with httpx.stream("POST", url + "/v1/messages", json=body, timeout=3600, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            first_byte = first_byte or time.perf_counter() - start
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "message_delta":  # (message_start goes out before the cache split is known)
                usage = event["usage"]
            if event.get("type") == "content_block_delta" and first_token is None:
                first_token = time.perf_counter() - start
    prompt = sum(v for k, v in usage.items() if k.endswith("input_tokens") and isinstance(v, int))
    return {"ttfb": first_byte or 0.0, "ttft": first_token or time.perf_counter() - start, "prompt": prompt,
            "cached": usage.get("cache_read_input_tokens") or 0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--md", default=str(ROOT / "docs" / "results" / "tables" / "claude_code_first.md"))
    args = parser.parse_args()
    body = capture()
    print(f"captured Claude Code's first request: {len(json.dumps(body)):,} bytes, {len(body.get('tools', []))} tools")
    service = local_service(args.model, engine="llamacpp", kv_budget_mb=1024, max_context_tokens=32768)
    with serve_in_thread(service) as url:
        rows = [("cold (first conversation, opt-in)", measure(url, args.model, body, opt_in=True)),
                ("new conversation (another prompt and attribution suffix)",
                 measure(url, args.model, another_conversation(body))),
                ("another folder (a new conversation elsewhere)",
                 measure(url, args.model, another_folder(body, "/home/user/projects/beta"))),
                ("another folder, opt-in (`X-Leyline-Client-Edits: amortize`)",
                 measure(url, args.model, another_folder(body, "/srv/work/gamma-2"), opt_in=True))]  # fmt: skip
    lines = [f"<!-- .venv/bin/python benchmarks/bench_claude_code_first.py --model {args.model} -->",
             "| request | prompt tokens | read from cache | first byte | first token |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, m in rows:
        lines.append(f"| {name} | {m['prompt']:,} | {m['cached']:,} | {m['ttfb']:.2f} s | {m['ttft']:.1f} s |")
    table = "\n".join(lines) + "\n"
    print(table)
    Path(args.md).write_text(table)


if __name__ == "__main__":
    main()
