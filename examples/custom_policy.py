"""A custom policy in ten lines, registered by name and used in a session.

    python examples/custom_policy.py

To make a policy loadable by name from another package, register it under the entry-point group
``leyline.policies`` in that package's ``pyproject.toml``::

    [project.entry-points."leyline.policies"]
    shorten_test_logs = "my_package.policies:ShortenTestLogs"

Inside one program, the ``@register`` decorator does the same (and returns the class unchanged).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn  # noqa: E402
from leyline_policies import Conversation, Edit, PolicyBase, TruncateOlderThanN, load_policy, register  # noqa: E402
from leyline_sdk import AsyncLeyline  # noqa: E402
from leyline_server.local import local_service, serve_in_thread  # noqa: E402


@register("shorten_run_outputs")
class ShortenRunOutputs(PolicyBase):
    """Keep only the last ``keep`` lines of ``run`` outputs once the agent has moved on."""

    name = "shorten_run_outputs"

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep

    def propose(self, conversation: Conversation) -> list[Edit]:
        edits = []
        for i, m in enumerate(conversation.messages):
            lines = str(m.get("content") or "").splitlines()
            if m.get("role") == "tool" and conversation.assistant_turns_after(i) and len(lines) > self.keep:
                tool, _ = conversation.tool_name_and_args(i)
                if tool == "run":
                    text = "\n".join([f"[{len(lines) - self.keep} lines cut]", *lines[-self.keep :]])
                    removed = len(str(m.get("content"))) - len(text)
                    edits.append(Edit(i, text, reason="long run output", policy=self.name, removed_chars=removed))
        return edits


async def main() -> None:
    """Load the policy by name, chain it with a built-in, and run a few turns."""
    policy = load_policy("shorten_run_outputs", keep=2) | TruncateOlderThanN(4)
    with serve_in_thread(local_service(kv_budget_mb=32, max_context_tokens=60_000)) as url:
        async with AsyncLeyline(base_url=url + "/v1", policies=[policy]) as client:
            session = client.session(tools=TOOLS)
            messages = [SYSTEM, TASK]
            for turn in range(6):
                await session.create(model="tiny-mla", messages=messages, max_tokens=2)
                messages += agent_turn(turn)
            for s in session.stats:
                print(
                    f"turn {s.turn}: cleared {s.cleared} ({s.removed_chars} chars), rotated {s.rotated_tokens}, "
                    f"prefilled {s.prefilled_tokens}, fallback {s.fallback}"
                )


if __name__ == "__main__":
    asyncio.run(main())
