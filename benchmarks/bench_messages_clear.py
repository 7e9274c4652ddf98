"""A Claude-Code-sized conversation whose old tool results the server clears, then continued.

    .venv/bin/python benchmarks/bench_messages_clear.py [--tokens 20000] [--repeats 2]

What a Claude Code user on Leyline meets: a tool loop through the Messages API (the anthropic
SDK, the real server on loopback, the llama.cpp engine) with a ~3k-token system prompt, 24 tools
and ~1.2k-token tool results, grown until the prompt holds ``--tokens``; then the next request
asks the server to clear all but the ``--keep`` latest tool results (``context_management``
``clear_tool_uses_20250919``, as Anthropic's own context editing). Measured is that request's
time to its first token (``max_tokens: 1``), three ways, in one run:

* **splice** — with ``X-Leyline-Client-Edits: amortize``: the cleared spans spliced, the rest of
  the conversation's cache rotated into place;
* **re-prefill, same engine** — without the opt-in: the server recomputes from the first cleared
  result on (exact);
* **llama.cpp's re-prefill** — ``llama_cpp.Llama`` on the same GGUF, which reuses the longest
  common prefix of its cache and prefills the rest (what llama.cpp's server does).

The model is ``tiny-gqa-long`` (random weights, 2 layers, 131k positions), so the seconds are the
mechanism's cost on a small network, not a real model's (the real 32k presets take minutes to
prefill such a conversation on 2 cores: ``bench_claude_code_first.py``). Writes
``docs/results/tables/messages_clear_keep<K>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-gqa-long"
CONTEXT = 65536
KEEP = 2  # tool uses kept whole (--keep)
CLEAR: dict[str, Any] = {}


def set_keep(keep: int) -> None:
    """The clearing request's edit: all but the ``keep`` latest tool results cleared."""
    global KEEP
    KEEP = keep
    CLEAR["edits"] = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": keep + 1},
                       "keep": {"type": "tool_uses", "value": keep}}]  # fmt: skip


def system_prompt() -> str:
    """~3k tokens of instructions (this repo's design document)."""
    return "You are a coding agent.\n\n" + (ROOT / "docs" / "design.md").read_text()[:3000]


def tools() -> list[dict[str, Any]]:
    """24 tools with schemas, as Claude Code sends."""
    out = [{"name": "read_next", "description": "Read the next file of the project.",
            "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}]  # fmt: skip
    for i in range(23):
        props = {f"arg_{k}": {"type": "string", "description": f"argument {k} of tool {i}"} for k in range(3)}
        out.append({"name": f"tool_{i}", "description": f"Tool number {i}: does one thing well.",
                    "input_schema": {"type": "object", "properties": props}})  # fmt: skip
    return out


def results() -> list[str]:
    """Tool results: ~1.2k-token slices of this repo's source."""
    text = "".join(p.read_text() for p in sorted((ROOT / "src" / "leyline_server").rglob("*.py")))
    return [text[i : i + 1200] for i in range(0, len(text), 1200)]


async def grow(client: Any, system: str, target: int, opening: str) -> tuple[list[dict[str, Any]], int]:
    """A forced-call tool loop until the prompt holds ``target`` tokens: the conversation, its prompt size."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": opening}]
    chunks, prompt = results(), 0
    while prompt < target or len(messages) < 2 * (KEEP + 2):  # at least KEEP + 2 tool uses
        message = await client.messages.create(
            model=MODEL, system=system, messages=messages, tools=tools(), max_tokens=32,
            tool_choice={"type": "tool", "name": "read_next", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},
        )  # fmt: skip
        usage = message.usage
        prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        print(f"    {prompt:,} tokens, {usage.input_tokens:,} computed", flush=True)
        (call,) = [b for b in message.content if b.type == "tool_use"]
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": chunks[len(messages) % len(chunks)]}]}]  # fmt: skip
    return messages, prompt


async def cleared_turn(client: Any, system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The clearing request: seconds to its first token, and what the server reported."""
    started = time.perf_counter()
    raw = await client.messages.with_raw_response.create(
        model=MODEL, system=system, messages=[*messages, {"role": "user", "content": "Go on."}], tools=tools(),
        max_tokens=1, extra_body={"temperature": 0, "context_management": CLEAR},
    )  # fmt: skip
    seconds = time.perf_counter() - started
    body = (await raw.parse()).model_dump()
    counts = {k: int(raw.headers[f"x-leyline-{k}-tokens"]) for k in ("reused", "rotated", "prefilled")}
    (applied,) = body["context_management"]["applied_edits"]
    return {"seconds": seconds, **counts, "cleared": applied["cleared_input_tokens"], "prompt": sum(counts.values())}


async def served_arms(url: str, target: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    import anthropic

    arms: dict[str, list[dict[str, Any]]] = {"splice": [], "re-prefill (same engine)": []}
    system = system_prompt()
    for repeat in range(repeats):
        for arm, headers in (("splice", {"X-Leyline-Client-Edits": "amortize"}), ("re-prefill (same engine)", {})):
            async with anthropic.AsyncAnthropic(base_url=url, api_key="x", default_headers=headers,
                                                max_retries=0, timeout=600) as client:  # fmt: skip
                messages, _ = await grow(client, system, target, f"Read the project ({arm}, run {repeat}).")
                arms[arm].append(await cleared_turn(client, system, messages))
                print(f"  {arm} run {repeat}: {arms[arm][-1]}", flush=True)
    return arms


def llamacpp_arm(target: int, repeats: int) -> list[dict[str, Any]]:
    """llama.cpp's own re-prefill of the same edit, on the same GGUF (rendered by the tiny tokenizer)."""
    from llama_cpp import Llama

    from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer
    from leyline_server.api.messages_api.blocks import chat_tools, to_chat_messages
    from leyline_server.api.messages_api.context_edits import apply_context_edits
    from leyline_server.engines.llamacpp.convert import preset_gguf

    tokenizer = load_tiny_tokenizer()
    chat_tool_list = chat_tools(tools())[0]

    def render(messages: list[dict[str, Any]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, tools=chat_tool_list, tokenize=True, add_generation_prompt=True,
                                            return_dict=False)  # fmt: skip
        return list(ids)

    llm = Llama(model_path=str(preset_gguf(MODEL)), n_ctx=CONTEXT, n_batch=512, n_ubatch=512, verbose=False)
    chunks, out = results(), []
    for _ in range(repeats):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the project."}]
        while True:
            call = {"type": "tool_use", "id": f"toolu_{len(messages)}", "name": "read_next", "input": {}}
            messages += [{"role": "assistant", "content": [call]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                       "content": chunks[len(messages) % len(chunks)]}]}]  # fmt: skip
            chat = to_chat_messages(system_prompt(), [*messages, {"role": "user", "content": "Go on."}])
            before = render(chat)
            if len(before) >= target and len(messages) > 2 * (KEEP + 2):
                break
        count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
        after = render(apply_context_edits(chat, CLEAR, len(before), count).messages)
        llm.reset()
        next(iter(llm.generate(before, temp=0.0)))  # the previous turn's cache
        started = time.perf_counter()
        next(iter(llm.generate(after, temp=0.0)))
        common = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), len(after))
        seconds = time.perf_counter() - started
        out.append({"seconds": seconds, "reused": common, "rotated": 0, "prefilled": len(after) - common,
                    "cleared": len(before) - len(after), "prompt": len(after)})  # fmt: skip
        print(f"  llama.cpp: {out[-1]}", flush=True)
    return out


def table(arms: dict[str, list[dict[str, Any]]]) -> str:
    base = statistics.median(r["seconds"] for r in arms["llama.cpp's re-prefill"])
    head = (
        "| continuation | prompt tokens | cleared tokens | reused | rotated | prefilled | first token (s) "
        "| vs llama.cpp |"
    )
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm, runs in arms.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(f"| {arm} | {med['prompt']:,.0f} | {med['cleared']:,.0f} | {med['reused']:,.0f} | "
                     f"{med['rotated']:,.0f} | {med['prefilled']:,.0f} | {med['seconds']:.2f} | "
                     f"{base / med['seconds']:.1f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000, help="prompt size before the clearing")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", type=int, default=2, help="tool uses kept whole (the rest cleared)")
    args = parser.parse_args()
    set_keep(args.keep)
    from leyline_server.local import local_service, serve_in_thread

    service = local_service(MODEL, engine="llamacpp", kv_budget_mb=1024, max_context_tokens=CONTEXT)
    with serve_in_thread(service) as url:
        arms = asyncio.run(served_arms(url, args.tokens, args.repeats))
    del service
    arms["llama.cpp's re-prefill"] = llamacpp_arm(args.tokens, args.repeats)
    out = table(arms)
    print(out)
    target = ROOT / "docs" / "results" / "tables" / f"messages_clear_keep{args.keep}.md"
    target.write_text(f"<!-- .venv/bin/python benchmarks/bench_messages_clear.py --tokens {args.tokens} "
                      f"--repeats {args.repeats} --keep {args.keep} -->\n" + out)  # fmt: skip


if __name__ == "__main__":
    main()
