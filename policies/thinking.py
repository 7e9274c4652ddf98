"""ClearThinking: reasoning older than the last ``keep`` assistant turns becomes a stub, or disappears.

Reasoning models' own templates drop earlier reasoning once a new user query arrives; within a
long tool loop (or with a template that keeps reasoning) it stays and grows. Like Anthropic's
thinking-block clearing, this policy clears it — as a splice: the edit is ``evict``
(``amortize``), so later turns keep what they concluded from it.

Reasoning is found where models put it: a ``<think>…</think>`` block at the start of the
content, or a ``reasoning_content`` field (edited in place, ``Edit.field``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from leyline_policies.base import Conversation, Edit, Mode, PolicyBase, as_mode

__all__ = ["ClearThinking", "reasoning_of"]

THINK = re.compile(r"\A(\s*<think>)(.*?)(</think>)", re.DOTALL)
STUB_PREFIX = "[reasoning cleared"


def reasoning_of(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(field, reasoning)`` of an assistant message: ``reasoning_content``, else a leading ``<think>`` block."""
    field = message.get("reasoning_content")
    if isinstance(field, str):
        return ("reasoning_content", field) if field.strip() else None
    content = message.get("content")
    if isinstance(content, str):
        match = THINK.match(content)
        if match and match.group(2).strip():
            return "content", match.group(2)
    return None


class ClearThinking(PolicyBase):
    """Clear the reasoning of assistant turns older than the last ``keep`` (that carry reasoning).

    ``stub``: a text with ``{chars}`` (the cleared length) put in the reasoning's place; ``None``
    removes the reasoning altogether (a ``<think>`` block with everything up to the answer, or
    an empty ``reasoning_content``). Reasoning shorter than ``min_chars`` stays::

        ClearThinking(keep=1)                       # "[reasoning cleared: 1,234 chars]"
        ClearThinking(keep=2, stub=None)            # gone, like a template that strips it
    """

    name = "clear_thinking"

    def __init__(
        self,
        keep: int = 1,
        stub: str | None = "[reasoning cleared: {chars:,} chars]",
        min_chars: int = 0,
        mode: Mode | str = Mode.AMORTIZE,
    ) -> None:
        if keep < 0:
            raise ValueError("keep must be >= 0")
        if min_chars < 0:
            raise ValueError("min_chars must be >= 0")
        if stub is not None and not stub.startswith(STUB_PREFIX):
            raise ValueError(f"a stub must start with {STUB_PREFIX!r} (so it is never cleared twice)")
        self.keep = keep
        self.stub = stub
        self.min_chars = min_chars
        self.mode = as_mode(mode)

    def propose(self, conversation: Conversation) -> list[Edit]:
        """One edit per assistant turn with reasoning, older than the last ``keep`` such turns."""
        found = [
            (i, r)
            for i, m in enumerate(conversation.messages)
            if m.get("role") == "assistant"
            for r in [reasoning_of(m)]
            if r
        ]
        edits = []
        for pos, (i, (field, reasoning)) in enumerate(found[: max(len(found) - self.keep, 0)]):
            if reasoning.strip().startswith(STUB_PREFIX) or len(reasoning) < self.min_chars:
                continue
            stub = self.stub.format(chars=len(reasoning)) if self.stub is not None else None
            if field == "reasoning_content":
                replacement = stub if stub is not None else ""
            else:
                replacement = self._content(str(conversation.messages[i]["content"]), stub)
            reason = f"reasoning older than the last {len(found) - pos - 1} turns with reasoning"
            edits.append(Edit(i, replacement, self.mode, reason, self.name, len(reasoning), field=field))
        return edits

    @staticmethod
    def _content(content: str, stub: str | None) -> str:
        """``content`` with its leading ``<think>`` block's reasoning replaced (or the block removed)."""
        match = THINK.match(content)
        assert match is not None
        if stub is not None:
            return content[: match.start(2)] + f"\n{stub}\n" + content[match.end(2) :]
        return content[match.end(3) :].lstrip("\n")
