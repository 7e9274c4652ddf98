"""StaleToolDetector: superseded reads, reads invalidated by writes, retried failures, duplicates."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from leyline_policies.base import Conversation, Edit, EditKind, Mode, PolicyBase, as_mode, content_text
from leyline_policies.errata import Erratum
from leyline_policies.stubs import invalidated_read_erratum, is_stub, restub, tool_stub

__all__ = ["StaleToolDetector", "looks_failed"]

DEFAULT_READS = frozenset({"read_file", "cat", "view", "open_file", "read"})
DEFAULT_WRITES = frozenset({"write_file", "edit_file", "apply_patch", "str_replace", "create_file", "write"})
DEFAULT_KEYS = ("path", "file", "filename", "file_path", "url", "resource")
INVALIDATED = "invalidated by a later write"
OnInvalidated = Literal["erratum", "forget", "evict"]


def looks_failed(text: str) -> bool:
    """A tool output that reports a failure (error, traceback, non-zero exit)."""
    head = text.lstrip()[:200].lower()
    return (
        head.startswith(("error", "traceback", "exception", "fatal"))
        or "exit code: 1" in head
        or "exit status 1" in head
    )


@dataclass(frozen=True)
class _Call:
    """One answered tool call as the detector sees it (``stubbed``: its output is a stub already)."""

    index: int
    tool: str
    args: dict[str, Any]
    resource: Any
    text: str
    stubbed: bool


class StaleToolDetector(PolicyBase):
    """Find tool outputs that a later call made stale, and say what kind of change each needs.

    * **superseded read** — the same resource read again later (no write in between): the
      earlier output is evicted (``evict``, ``mode``, default ``amortize``: its conclusions hold);
    * **invalidated read** — a later (successful) write changed the resource: a *fact* changed,
      so by ``on_invalidated``:

      - ``"erratum"`` (default) — a ``correct`` edit with an erratum appended at the end: it names
        the read, says its output is outdated, names the write and gives the new value (the
        write's content, quoted up to ``max_value_chars``, or its output) or where to find it (a
        later re-read). Nothing is invalidated: the prefix cache stays aligned, and it works on
        any server. If the read was also re-read after the write, its output is evicted too;
      - ``"forget"`` — a ``correct`` edit: the output becomes an ``[outdated: …]`` stub and
        everything from it on is recomputed (exact, costs a re-prefill of the suffix);
      - ``"evict"`` — the old behaviour: an ``amortize`` stub (the model keeps its notes on the
        old value; cheapest, and wrong when those notes matter);
    * **retried failure** — a failed call followed by another call of the same tool on the same
      resource (or with the same arguments): evicted;
    * **duplicate output** — an output identical to a later one: evicted.

    Outputs already stubbed (evicted earlier, e.g. by ``TruncateOlderThanN``) still get their
    correction: the model's notes on them remain. Resources come from the call arguments:
    ``resource_keys`` maps a tool to the argument name (or a function of the arguments);
    otherwise the first of ``path``, ``file``, ``url``, … ::

        StaleToolDetector(resource_keys={"grep": lambda a: a["pattern"]}, exclude_tools={"plan"})
        StaleToolDetector(on_invalidated="forget")       # exact: recompute after a changed fact
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
        on_invalidated: OnInvalidated = "erratum",
        erratum_role: str = "user",
        max_value_chars: int = 1000,
    ) -> None:
        self.read_tools = frozenset(read_tools)
        self.write_tools = frozenset(write_tools)
        self.resource_keys = dict(resource_keys or {})
        self.exclude_tools = frozenset(exclude_tools)
        self.is_failure = is_failure
        self.mode = as_mode(mode)
        if on_invalidated not in ("erratum", "forget", "evict"):
            raise ValueError(f"on_invalidated must be 'erratum', 'forget' or 'evict', got {on_invalidated!r}")
        if max_value_chars < 0:
            raise ValueError("max_value_chars must be >= 0")
        self.on_invalidated = on_invalidated
        self.erratum_role = erratum_role
        self.max_value_chars = max_value_chars
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

    def _calls(self, conversation: Conversation) -> list[_Call]:
        calls = []
        for i, m in enumerate(conversation.messages):
            if m.get("role") != "tool":
                continue
            tool, args = conversation.tool_name_and_args(i)
            if tool in self.exclude_tools:
                continue
            text = content_text(m)
            calls.append(_Call(i, tool, args, self.resource(tool, args), text, is_stub(text)))
        return calls

    def propose(self, conversation: Conversation) -> list[Edit]:
        """Edits for every stale tool output (each message at most once)."""
        calls = self._calls(conversation)
        edits: list[Edit] = []
        for k, call in enumerate(calls):
            later = calls[k + 1 :]
            edit = self._read_edit(call, later)
            if edit is None and not call.stubbed:
                edit = self._other_edit(call, [c for c in later if not c.stubbed])
            if edit is not None:
                edits.append(edit)
        return edits

    def _evict(self, call: _Call, why: str, reason: str) -> Edit:
        stub = tool_stub(call.tool, call.args, len(call.text), why)
        return Edit(call.index, stub, self.mode, reason, self.name, len(call.text), kind=EditKind.EVICT)

    def _read_edit(self, call: _Call, later: list[_Call]) -> Edit | None:
        """Superseded or invalidated read (``None`` if neither, or nothing left to do)."""
        if call.tool not in self.read_tools or call.resource is None:
            return None
        same = [c for c in later if c.resource == call.resource]
        reread = next((c for c in same if c.tool in self.read_tools and not c.stubbed), None)
        write = next(
            (c for c in same if c.tool in self.write_tools and (c.stubbed or not self.is_failure(c.text))), None
        )
        if reread is not None and (write is None or reread.index < write.index):
            return None if call.stubbed else self._evict(call, "stale", "superseded by a later read")
        if write is None:
            return None
        return self._invalidated(call, write, reread)  # a re-read here comes after the write

    def _invalidated(self, call: _Call, write: _Call, reread: _Call | None) -> Edit | None:
        """The edit for a read that ``write`` changed (``reread``: a later read shows the new value)."""
        if self.on_invalidated == "evict":
            return None if call.stubbed else self._evict(call, "stale", INVALIDATED)
        note = f"changed later by {write.tool}"
        if self.on_invalidated == "forget":
            if call.text.startswith("[outdated:"):
                return None  # corrected already
            stub = restub(call.text, "outdated", note) if call.stubbed else None
            stub = stub or tool_stub(call.tool, call.args, len(call.text), "outdated", note)
            removed = 0 if call.stubbed else len(call.text)
            return Edit(call.index, stub, Mode.FORGET, INVALIDATED, self.name, removed, kind=EditKind.CORRECT)
        text = invalidated_read_erratum(
            (call.tool, call.args),
            (write.tool, write.args),
            write.text,
            (reread.tool, reread.args) if reread is not None else None,
            self.max_value_chars,
        )
        evict = reread is not None and not call.stubbed  # the new value is in view: the old output can go
        stub = tool_stub(call.tool, call.args, len(call.text), "outdated", note) if evict else None
        erratum = Erratum(text, self.erratum_role)
        removed = len(call.text) if evict else 0
        mode = self.mode if evict else Mode.AMORTIZE
        return Edit(call.index, stub, mode, INVALIDATED, self.name, removed, kind=EditKind.CORRECT, erratum=erratum)

    def _other_edit(self, call: _Call, later: list[_Call]) -> Edit | None:
        """Retried failure or duplicate output (``later``: outputs not stubbed)."""
        if self.is_failure(call.text) and any(
            c.tool == call.tool and (c.resource == call.resource if call.resource is not None else c.args == call.args)
            for c in later
        ):
            return self._evict(call, "stale", "failed call that was retried")
        if call.text and any(c.text == call.text for c in later):
            return self._evict(call, "stale", "duplicate of a later output")
        return None
