"""StaleToolDetector: superseded reads, reads invalidated by writes, retried failures, duplicates."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from leyline_policies.base import Conversation, Edit, Mode, PolicyBase, as_mode, content_text
from leyline_policies.stubs import is_stub, tool_stub

__all__ = ["StaleToolDetector", "looks_failed"]

DEFAULT_READS = frozenset({"read_file", "cat", "view", "open_file", "read"})
DEFAULT_WRITES = frozenset({"write_file", "edit_file", "apply_patch", "str_replace", "create_file", "write"})
DEFAULT_KEYS = ("path", "file", "filename", "file_path", "url", "resource")


def looks_failed(text: str) -> bool:
    """A tool output that reports a failure (error, traceback, non-zero exit)."""
    head = text.lstrip()[:200].lower()
    return (
        head.startswith(("error", "traceback", "exception", "fatal"))
        or "exit code: 1" in head
        or "exit status 1" in head
    )


class StaleToolDetector(PolicyBase):
    """Stub tool outputs that a later call made stale.

    * **superseded read** — the same resource read again later: the earlier output goes;
    * **invalidated read** — a later write to the resource makes an earlier read's output stale;
    * **retried failure** — a failed call followed by another call of the same tool on the same
      resource (or with the same arguments);
    * **duplicate output** — an output identical to a later one.

    Resources come from the call arguments: ``resource_keys`` maps a tool to the argument name
    (or a function of the arguments); otherwise the first of ``path``, ``file``, ``url``, … ::

        StaleToolDetector(resource_keys={"grep": lambda a: a["pattern"]}, exclude_tools={"plan"})
    """

    name = "stale_tool_detector"

    def __init__(
        self,
        read_tools: Iterable[str] = DEFAULT_READS,
        write_tools: Iterable[str] = DEFAULT_WRITES,
        resource_keys: Mapping[str, str | Callable[[dict[str, Any]], Any]] | None = None,
        exclude_tools: Iterable[str] = (),
        is_failure: Callable[[str], bool] = looks_failed,
        mode: Mode | str = Mode.AMORTIZE,
    ) -> None:
        self.read_tools = frozenset(read_tools)
        self.write_tools = frozenset(write_tools)
        self.resource_keys = dict(resource_keys or {})
        self.exclude_tools = frozenset(exclude_tools)
        self.is_failure = is_failure
        self.mode = as_mode(mode)
        overlap = self.read_tools & self.write_tools
        if overlap:
            raise ValueError(f"tools cannot be both read and write tools: {sorted(overlap)}")

    def resource(self, tool: str, args: dict[str, Any]) -> Any:
        """The resource a call touches (``None`` if unknown)."""
        key = self.resource_keys.get(tool)
        if callable(key):
            return key(args)
        if isinstance(key, str):
            return args.get(key)
        return next((args[k] for k in DEFAULT_KEYS if k in args), None)

    def propose(self, conversation: Conversation) -> list[Edit]:
        """Edits for every stale tool output (each message at most once)."""
        calls = []
        for i, m in enumerate(conversation.messages):
            if m.get("role") != "tool":
                continue
            tool, args = conversation.tool_name_and_args(i)
            text = content_text(m)
            if tool in self.exclude_tools or is_stub(text):
                continue
            res = self.resource(tool, args)
            calls.append((i, tool, args, res, text))
        edits: dict[int, Edit] = {}
        for k, (i, tool, args, res, text) in enumerate(calls):
            later = calls[k + 1 :]
            why = None
            if tool in self.read_tools and res is not None:
                if any(t in self.read_tools and r == res for _, t, _, r, _ in later):
                    why = "superseded by a later read"
                elif any(t in self.write_tools and r == res for _, t, _, r, _ in later):
                    why = "invalidated by a later write"
            if (
                why is None
                and self.is_failure(text)
                and any(t == tool and (r == res if res is not None else a == args) for _, t, a, r, _ in later)
            ):
                why = "failed call that was retried"
            if why is None and text and any(x == text for *_, x in later):
                why = "duplicate of a later output"
            if why is not None:
                edits[i] = Edit(i, tool_stub(tool, args, len(text), "stale"), self.mode, why, self.name, len(text))
        return [edits[i] for i in sorted(edits)]
