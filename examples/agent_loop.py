"""A tool-using agent loop on the embedded server with policies, printing a per-turn table.

    python examples/agent_loop.py [--turns 10] [--base-url http://127.0.0.1:8000/v1]

Without ``--base-url`` it starts the embedded server (tiny-mla) itself; with it, the URL
includes ``/v1`` (the OpenAI client's convention). The agent's moves are
scripted (``examples/trace.py``) so that it runs without a real model; the loop is what a real
agent does: send the full history, append the model's answer and the tool results, repeat.
Policies: stale tool outputs (re-reads, retried failures) and tool outputs older than 2 turns.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples._cli import run, server  # noqa: E402
from examples.trace import SYSTEM, TASK, TOOLS, agent_turn  # noqa: E402
from leyline_policies import StaleToolDetector, TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402


async def agent(base_url: str, turns: int, model: str) -> None:
    """Run the loop and print one line per turn."""
    async with AsyncLeyline(base_url=base_url, policies=[StaleToolDetector(), TruncateOlderThanN(2)]) as client:
        session = client.session(tools=TOOLS)
        messages = [SYSTEM, TASK]
        print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'rotated':>8} {'prefill':>8} {'cleared':>8} {'fallback':>10}")
        for turn in range(turns):
            response = await session.create(model=model, messages=messages, max_tokens=8)
            s = session.stats[-1]
            print(
                f"{s.turn:4d} {s.prompt_tokens:7d} {s.cached_tokens:7d} {s.rotated_tokens:8d} "
                f"{s.prefilled_tokens:8d} {s.cleared:8d} {s.fallback or '-':>10}"
            )
            _ = response.choices[0].message  # a real agent would act on this
            messages += agent_turn(turn)
        full = sum(len(str(m.get("content") or "")) for m in session.history)
        seen = sum(len(str(m.get("content") or "")) for m in session.effective)
        print(f"history kept in full: {len(session.history)} messages, {full:,} chars; the model sees {seen:,} chars")


def main() -> int:
    """Parse the flags, find or start a server, run the loop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--base-url", default=None, help="a running server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="tiny-mla")
    args = parser.parse_args()
    with server(args.base_url, model=args.model, kv_budget_mb=64, max_context_tokens=60_000) as url:
        return run(agent(url, args.turns, args.model), url)


if __name__ == "__main__":
    raise SystemExit(main())
