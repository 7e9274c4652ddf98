"""TruncateOlderThanN: tool outputs older than ``n`` assistant turns become a stub."""

from __future__ import annotations

from collections.abc import Iterable

from leyline_policies.base import Conversation, Edit, EditKind, Mode, PolicyBase, as_mode, content_text
from leyline_policies.stubs import is_stub, tool_stub

__all__ = ["TruncateOlderThanN"]


class TruncateOlderThanN(PolicyBase):
    """Replace the output of tool calls made more than ``n`` assistant turns ago by a stub.

    A tool result's age is the number of assistant messages after the assistant message that
    called it; results with age ``>= n`` are evicted (``n=2`` keeps the outputs of the last two
    tool-calling turns). The stub names the tool, its arguments and the size removed::

        TruncateOlderThanN(n=2, exclude_tools={"plan"})
    """

    name = "truncate_older_than_n"

    def __init__(
        self, n: int = 2, exclude_tools: Iterable[str] = (), min_chars: int = 0, mode: Mode | str = Mode.AMORTIZE
    ) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        if min_chars < 0:
            raise ValueError("min_chars must be >= 0")
        self.n = n
        self.exclude_tools = frozenset(exclude_tools)
        self.min_chars = min_chars
        self.mode = as_mode(mode)

    def propose(self, conversation: Conversation) -> list[Edit]:
        """One stub edit per old, not yet evicted, tool output."""
        edits = []
        for i, message in enumerate(conversation.messages):
            if message.get("role") != "tool":
                continue
            tool, args = conversation.tool_name_and_args(i)
            if tool in self.exclude_tools:
                continue
            age = conversation.assistant_turns_after(conversation.calling_turn(i))
            text = content_text(message)
            if age < self.n or len(text) <= self.min_chars or is_stub(text):
                continue
            stub = tool_stub(tool, args, len(text))
            reason = f"tool output {age} turns old"
            edits.append(Edit(i, stub, self.mode, reason, self.name, len(text), kind=EditKind.EVICT))
        return edits
