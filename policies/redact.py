"""Redact: replace matches of patterns in any message, as ``forget`` (true forgetting)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from leyline_policies.base import Conversation, Edit, EditKind, Mode, PolicyBase, content_text

__all__ = ["Redact"]


class Redact(PolicyBase):
    """Replace every match of ``patterns`` by ``placeholder`` with mode ``forget``.

    Redaction must remove the secret's influence from the cache, so the server recomputes
    everything from the first redacted message::

        Redact([r"sk-[A-Za-z0-9]{8,}", r"password=\\S+"])
    """

    name = "redact"

    def __init__(
        self,
        patterns: Iterable[str | re.Pattern[str]],
        placeholder: str = "[redacted]",
        roles: Iterable[str] = ("system", "user", "assistant", "tool"),
        exclude_tools: Iterable[str] = (),
    ) -> None:
        self.patterns = [re.compile(p) if isinstance(p, str) else p for p in patterns]
        if not self.patterns:
            raise ValueError("give at least one pattern")
        self.placeholder = placeholder
        self.roles = frozenset(roles)
        self.exclude_tools = frozenset(exclude_tools)

    def propose(self, conversation: Conversation) -> list[Edit]:
        """A forget edit for every message that contains a match."""
        edits = []
        for i, m in enumerate(conversation.messages):
            if m.get("role") not in self.roles or not isinstance(m.get("content"), str):
                continue
            if m.get("role") == "tool" and conversation.tool_name_and_args(i)[0] in self.exclude_tools:
                continue
            text = content_text(m)
            redacted = text
            for pattern in self.patterns:
                redacted = pattern.sub(self.placeholder, redacted)
            if redacted != text:
                removed = len(text) - len(redacted)
                reason = "matched a redaction pattern"
                edits.append(Edit(i, redacted, Mode.FORGET, reason, self.name, removed, kind=EditKind.REDACT))
        return edits
