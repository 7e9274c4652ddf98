"""debug-gym's mini_nightmare tasks through AsyncLeyline with TruncateOlderThanN(2).

    pip install debug-gym
    python examples/debug_gym_agent.py --base-url http://HOST:8000/v1 --model MODEL [--tasks 10]

This needs a real model behind an OpenAI-compatible endpoint (a ``leyline-server --model PATH``
for the splice, or any other server: policies still shorten the context) and debug-gym with its
terminal backend; neither is available offline, so without them the script says so and exits 2.
The loop: reset a task, show the model the observation and tools, execute the tool calls it
makes in the environment, feed the results back, until the task is solved or the step budget
runs out; report the solve rate and Leyline's per-turn stats.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leyline_policies import TruncateOlderThanN  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402


def requirements_missing(base_url: str | None, model: str | None) -> str | None:
    """Why the example cannot run here, or ``None``."""
    if importlib.util.find_spec("debug_gym") is None:
        return "debug-gym is not installed (pip install debug-gym)"
    if not base_url or not model:
        return "a real model is needed: pass --base-url and --model of an OpenAI-compatible endpoint"
    return None


async def solve(env: Any, client: AsyncLeyline, model: str, max_steps: int) -> bool:
    """One task: let the model call the environment's tools until done."""
    info = env.reset()
    tools = [{"type": "function", "function": t} for t in getattr(info, "tools", [])]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Fix the bug so that the hidden tests pass. Use the tools."},
        {"role": "user", "content": str(getattr(info, "step_observation", info))},
    ]
    session = client.session(tools=tools)
    for _ in range(max_steps):
        response = await session.create(model=model, messages=messages, max_tokens=1024)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            action = {"name": call.function.name, "arguments": json.loads(call.function.arguments or "{}")}
            info = env.step(action)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": str(getattr(info, "step_observation", info))}
            )
            if getattr(info, "done", False):
                return bool(getattr(info, "resolved", True))
        if not message.tool_calls:
            break
    return False


async def run(args: argparse.Namespace) -> int:
    """Run the benchmark tasks (needs debug-gym)."""
    from debug_gym.gym.envs import select_env  # type: ignore[import-not-found]

    env_cls = select_env("mini_nightmare")
    client = AsyncLeyline(base_url=args.base_url, api_key=args.api_key, policies=[TruncateOlderThanN(2)])
    solved = 0
    for task in range(args.tasks):
        env = env_cls(problems=[task]) if args.tasks else env_cls()
        solved += await solve(env, client, args.model, args.max_steps)
        print(f"task {task}: solved so far {solved}/{task + 1}")
    await client.aclose()
    print(f"solve rate: {solved / max(args.tasks, 1):.1%}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=30)
    args = parser.parse_args()
    missing = requirements_missing(args.base_url, args.model)
    if missing:
        print(f"debug_gym_agent: {missing}", file=sys.stderr)
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
