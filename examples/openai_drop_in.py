"""Swap ``openai.AsyncOpenAI`` for ``AsyncLeyline``: the same calls, the cache edited in place.

    python examples/openai_drop_in.py [--base-url http://127.0.0.1:8000/v1]

The only change to an existing agent is the constructor line; ``create`` takes and returns what
``openai`` does (``ChatCompletion`` / an async stream of ``ChatCompletionChunk``), plus a
``.leyline`` field. The session is found by the message prefix, so the agent code keeps
sending its full history as before.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples._cli import run as run_cli  # noqa: E402
from examples._cli import server  # noqa: E402
from examples.trace import SYSTEM, TASK, TOOLS, agent_turn  # noqa: E402
from leyline_policies import TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402


async def run(base_url: str) -> None:
    """Five turns, the last one streamed."""
    # before: client = openai.AsyncOpenAI(base_url=base_url, api_key="...")
    client = AsyncLeyline(base_url=base_url, api_key="unused", policies=[TruncateOlderThanN(2)])
    messages = [SYSTEM, TASK]
    for turn in range(4):
        r = await client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=4)
        print(
            f"turn {turn + 1}: finish={r.choices[0].finish_reason} cached={r.usage.prompt_tokens_details.cached_tokens}"
            f"/{r.usage.prompt_tokens} rotated={r.leyline['rotated_tokens']}"
        )
        messages += agent_turn(turn)
    stream = await client.chat.completions.create(
        model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=4, stream=True
    )
    chunks = [chunk async for chunk in stream]
    print(f"turn 5 (streamed): {len(chunks)} chunks, finish={chunks[-1].choices[0].finish_reason}")
    await client.aclose()


def main() -> int:
    """Find or start a server and run the five turns."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running server, e.g. http://127.0.0.1:8000/v1")
    args = parser.parse_args()
    with server(args.base_url, kv_budget_mb=32) as url:
        return run_cli(run(url), url)


if __name__ == "__main__":
    raise SystemExit(main())
