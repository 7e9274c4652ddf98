"""SDK time per turn on a 500-message, ~100k-token tool-heavy conversation (local tokenizer, no network).

Each turn the agent appends one turn (user, tool call, tool output, answer) and the policy
(``TruncateOlderThanN``, its ``n`` chosen so that exactly one more old tool output crosses it
per turn) stubs one old tool output. The agent calls ``AsyncLeyline.chat.completions.create``
with the project's tiny tokenizer as the client's local tokenizer: the session lookup by message
prefix, policies, the (incremental) render, the diff to directives, the local checks, and
openai-python's own work (argument transform, JSON encoding of the request, the HTTP client,
parsing the ``ChatCompletion``) and the bookkeeping of the answer. The "server" is an in-process
loopback (an ``httpx2.MockTransport`` handler) that decodes the request, renders on its own,
checks every splice like the real server (``apply(base, D)`` must be a prefix of its prompt) and
encodes its answer; its time is measured and taken out. The old path — one full render of the
conversation, which an earlier SDK did twice per turn — is timed in the same run.

    python benchmarks/bench_sdk_turn.py [--messages 500] [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_diff import tool_heavy_conversation  # noqa: E402
from leyline_policies import TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_sdk.core.directives import Directive, apply, digest  # noqa: E402
from leyline_sdk.render.incremental import IncrementalRenderer  # noqa: E402
from leyline_sdk.render.rendering import HFChatTokenizer  # noqa: E402
from leyline_sdk.render.tiny_tokenizer import load_tiny_tokenizer  # noqa: E402
from leyline_sdk.session.renderer import LocalRenderer  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


class LoopbackServer:
    """Answers the client in-process, checking each splice; ``spent`` is its own time."""

    def __init__(self, chat: HFChatTokenizer) -> None:
        self.renderer = IncrementalRenderer(chat)
        self.completion = list(chat.tokenizer("Reading it.<|im_end|>", add_special_tokens=False)["input_ids"])
        self.base: list[int] | None = None
        self.spent = 0.0
        self.fallbacks = 0

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        """The loopback's answer: the Leyline probe, a chat completion, or a session's deletion."""
        started = time.perf_counter()
        try:
            path = request.url.path
            answer: dict[str, Any] = {"deleted": True}
            if path.endswith("/leyline/tokenize"):  # the client's one-time probe
                answer = {"tokens": [], "message_spans": [], "prefix_stable": True}
            elif path.endswith("/chat/completions"):
                answer = self._chat(json.loads(request.content))
            return httpx2.Response(200, content=json.dumps(answer), headers={"content-type": "application/json"})
        finally:
            self.spent += time.perf_counter() - started

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = self.renderer.render(body["messages"], body.get("tools")).tokens
        ext = body.get("leyline") or {}
        directives = [Directive.model_validate(d) for d in ext.get("directives", [])]
        if self.base is not None and directives:
            spliced = apply(self.base, directives)
            self.fallbacks += not (ext["base"]["digest"] == digest(self.base) and prompt[: len(spliced)] == spliced)
        elif self.base is not None:
            self.fallbacks += 1  # the bench expects a splice every turn
        self.base = prompt + self.completion
        leyline = {
            "session_id": "loopback",
            "base": {"length": len(self.base), "digest": digest(self.base)},
            "completion_token_ids": self.completion,
        }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(self.completion), "total_tokens": 0}
        message = {"role": "assistant", "content": "Reading it."}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        head = {"id": "x", "object": "chat.completion", "created": 0, "model": "m"}
        return {**head, "choices": [choice], "usage": usage, "leyline": leyline}


async def run_turns(chat: HFChatTokenizer, messages: list[dict], start: int, turns: int) -> tuple[list[float], float]:
    """SDK milliseconds of each turn after the first, and the first turn's (which renders in full)."""
    server = LoopbackServer(chat)
    n = (sum(m["role"] == "assistant" for m in messages[:start]) - 10) // 2 * 2  # ~5 outputs already stubbed
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(server.handle))
    client = AsyncLeyline(
        base_url="http://loopback/v1", http_client=http, tokenizer=chat, policies=[TruncateOlderThanN(n)]
    )
    times: list[float] = []
    for turn in range(turns + 1):
        spent, started = server.spent, time.perf_counter()
        await client.chat.completions.create(model="m", messages=messages[: start + 4 * turn], tools=TOOLS)
        times.append((time.perf_counter() - started - (server.spent - spent)) * 1e3)
        (session,) = client.sessions
        if turn > 0:
            assert session.stats[-1].cleared == 1 and session.stats[-1].fallback is None, session.stats[-1]
    assert server.fallbacks == 0, "every turn must splice"
    renderer = session.renderer
    assert isinstance(renderer, LocalRenderer) and isinstance(renderer.tokenizer, IncrementalRenderer)
    assert renderer.tokenizer.full_renders == 1
    await client.close()
    return times[1:], times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()

    chat = HFChatTokenizer(load_tiny_tokenizer())
    messages = tool_heavy_conversation(args.messages + 4 * args.turns)
    t0 = time.perf_counter()
    full = chat.render(messages[: args.messages], tools=TOOLS)
    full_ms = (time.perf_counter() - t0) * 1e3
    per_turn, first = asyncio.run(run_turns(chat, messages, args.messages, args.turns))
    median, worst = statistics.median(per_turn), max(per_turn)
    n = len(full.tokens)
    print(f"{args.messages} messages, {n:,} tokens (tiny tokenizer); {args.turns} turns, each +4 messages and 1 stub\n")
    print("| path | per turn |")
    print("| --- | ---: |")
    print(f"| old: one full render of the conversation (an earlier SDK did two per turn) | {full_ms:,.0f} ms |")
    print(f"| new: first turn of a session (one full render) | {first:,.0f} ms |")
    print(f"| new: SDK time per turn, median (policies + render + diff + checks + openai) | {median:.1f} ms |")
    print(f"| new: SDK time per turn, worst of {args.turns} | {worst:.1f} ms |")
    print(f"\ntarget < 50 ms per turn: {'PASS' if median < 50 else 'MISS'}")


if __name__ == "__main__":
    main()
