"""The walk of one turn through the code: every project file a turn's code runs in, and how often
the turn comes back to a file it had left.

A server on the tiny preset (embedded engine, in this process), one conversation warmed up, then
one more turn traced: a Leyline SDK turn with an evicted tool output (``Leyline``, the blocking
client over the same session code as ``AsyncLeyline``: the architecture page's walk), and a plain
turn of each wire protocol (Chat Completions, the Responses API, the Messages API) through
openai's and anthropic's clients. Every Python function entered in ``src/`` or ``policies/`` is
recorded per thread (the standard library and third parties are not counted); a thread's files
in the order it entered them give the walk, and a *return* is entering a file again after having
left it for another. The client is this thread; the server is every other one.

    python benchmarks/turn_walk.py
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROJECT = (str(ROOT / "src") + "/", str(ROOT / "policies") + "/")
MODEL = "tiny-mla"
SDK_TURN = "SDK chat turn (evicted output spliced)"


@dataclass(frozen=True)
class Walk:
    """One turn's walk: the files it ran in, and the returns to a file already left (over threads)."""

    files: tuple[str, ...]
    returns: int


def walk_of(entries: Iterable[tuple[int, str]]) -> Walk:
    """The walk of ``entries`` ((thread, file) per function entered, in order)."""
    order: dict[str, None] = {}
    current: dict[int, str] = {}
    seen: dict[int, set[str]] = {}
    returns = 0
    for thread, file in entries:
        order.setdefault(file, None)
        if current.get(thread) == file:
            continue
        mine = seen.setdefault(thread, set())
        returns += file in mine
        mine.add(file)
        current[thread] = file
    return Walk(tuple(order), returns)


class Recorder:
    """Records (thread, project file) for each Python function entered while armed, in every thread
    started after it was installed (and the current one)."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str]] = []
        self.armed = False

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if self.armed and event == "call":
            file = frame.f_code.co_filename
            if file.startswith(PROJECT):
                self.entries.append((threading.get_ident(), file[len(str(ROOT)) + 1 :]))

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Profile this thread and every thread started inside the block."""
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        try:
            yield self
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]

    def trace(self, run: Callable[[], Any]) -> tuple[Walk, Walk]:
        """The walks of ``run()``: its client's (this thread) and its server's (every other thread)."""
        self.entries = []
        self.armed = True
        try:
            run()
        finally:
            self.armed = False
        me = threading.get_ident()
        return walk_of(e for e in self.entries if e[0] == me), walk_of(e for e in self.entries if e[0] != me)


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
OUTPUT = "".join(f"line {i}: value_{i} = {i * i}\n" for i in range(60))
OPENING: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the file."},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": OUTPUT},
    {"role": "user", "content": "What did you find?"},
]  # fmt: skip


def sdk_turns(url: str) -> Callable[[], Any]:
    """The next turn of a Leyline SDK session: the first reads a file; each later one has the
    file's output evicted (a stub), the last answer appended and a new question (the blocking
    client: the same session code as ``AsyncLeyline``)."""
    from leyline_sdk import Leyline

    client = Leyline(base_url=url + "/v1", api_key="x", max_retries=0)
    history = [dict(m) for m in OPENING]

    def turn() -> Any:
        r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=4, temperature=0)
        history[3]["content"] = "[evicted]"
        history.extend([{"role": "assistant", "content": r.choices[0].message.content or ""},
                        {"role": "user", "content": "And then?"}])  # fmt: skip
        return r

    return turn


def plain_turns(url: str, protocol: str) -> Callable[[], Any]:
    """The next turn of a plain client's conversation on ``protocol`` (chat, responses, messages):
    its history, the last answer appended, and a new question."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    ant = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    history: list[dict[str, Any]] = [{"role": "user", "content": "What is 7 squared?"}]

    def ask() -> str:
        if protocol == "chat":
            r = oai.chat.completions.create(model=MODEL, messages=history, max_tokens=4, temperature=0)
            return r.choices[0].message.content or ""
        if protocol == "responses":
            return oai.responses.create(model=MODEL, input=history, max_output_tokens=4, temperature=0).output_text
        m = ant.messages.create(model=MODEL, messages=history, max_tokens=4)
        return "".join(b.text for b in m.content if b.type == "text")

    def turn() -> str:
        text = ask()
        history.extend([{"role": "assistant", "content": text or "."}, {"role": "user", "content": "And then?"}])
        return text

    return turn


def trace_turns(plain: bool = True) -> dict[str, tuple[Walk, Walk]]:
    """Each kind of turn's (client, server) walk, on a fresh in-process server (``plain=False``:
    the SDK turn's only)."""
    from leyline_server.local import local_service, serve_in_thread

    recorder = Recorder()
    rows: dict[str, tuple[Walk, Walk]] = {}
    with recorder.installed(), serve_in_thread(local_service(MODEL, kv_budget_mb=64)) as url:
        kinds = {SDK_TURN: sdk_turns(url)}
        if plain:
            kinds |= {f"plain {p} turn": plain_turns(url, p) for p in ("chat", "responses", "messages")}
        for name, turn in kinds.items():
            turn()  # warm-up: the conversation's first turn, lazy imports and first compiles
            rows[name] = recorder.trace(turn)
    return rows


def main() -> None:
    """Trace one turn of each kind; print the table and the SDK turn's files."""
    rows = trace_turns()
    print("| turn | client: files, returns | server: files, returns |")
    print("|---|---|---|")
    for name, (client, server) in rows.items():
        print(f"| {name} | {len(client.files)}, {client.returns} | {len(server.files)}, {server.returns} |")
    for side, walk in zip(("client", "server"), rows[SDK_TURN], strict=True):
        print(f"\nSDK turn, {side} side, files in the order first entered:")
        print("\n".join(f"  {f}" for f in walk.files))


if __name__ == "__main__":
    main()
