"""The real model the agent tasks run on, served as docs/integrations.md tells a user to serve it.

Qwen2.5-Coder-1.5B-Instruct (the ``qwen2.5-coder-1.5b`` preset, ``make models`` fetches it) on the
llama.cpp engine with its full 32k context: the smallest model here that reads a file with an
agent's own tool and answers from it (the 0.5B calls tools but loses the thread after the result;
docs/integrations.md). Greedy (``--sampling-defaults '{"temperature": 0}'``: neither CLI lets its
user set a temperature), so that a run is the same run every time — with one more pin: both CLIs
write today's date into the prompt (Claude Code's ``currentDate`` reminder, Codex's
``<environment_context>``), and a greedy 1.5B model given another date may take another road (one
day it reads both files and answers, the next it reads them again until it gives up). The test
server sees :data:`PINNED_DATE` in its place, as a frozen clock would give (the CLIs are native
binaries, Codex a static one: no clock can be injected into them).

:class:`Served` records what the server was asked: every conversation it rendered (the chat
messages each protocol's adapter built), so a test can check that a tool's result went back.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leyline_server.api import pipeline
from tests.e2e.server_helpers import make_service, running_server

__all__ = ["MODEL", "PINNED_DATE", "Served", "served_real_model", "pin_dates", "messages_text", "events", "task_folder"]

MODEL = "qwen2.5-coder-1.5b"
TASKS = Path("/tmp/leyline-agent-tasks")
KV_BUDGET_MB = 1024  # 32k tokens at 28 KiB each (float16 KV): the whole context
PINNED_DATE = "2026-12-06"  # the date every prompt the tasks send holds (see the module docstring)


@dataclass
class Served:
    """A running server on the real model, and the conversations it was asked to continue."""

    url: str
    conversations: list[list[dict[str, Any]]] = field(default_factory=list)

    def saw(self, text: str, role: str) -> bool:
        """Whether some request held a ``role`` message whose text contains ``text``."""
        return any(text in messages_text(m) for c in self.conversations for m in c if m.get("role") == role)


@contextmanager
def served_real_model() -> Iterator[Served]:
    """The real model on a loopback port (see the module docstring), recording each conversation."""
    service = make_service(
        MODEL, engine="llamacpp", kv_budget_mb=KV_BUDGET_MB, max_context_tokens=32768,
        default_max_tokens=1024, sampling_defaults={"temperature": 0.0},
    )  # fmt: skip
    original = pipeline.ChatPipeline.prepare
    served = Served("")

    async def recording(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        pin_dates(req.messages)
        served.conversations.append([m.model_dump(exclude_none=True) for m in req.messages])
        return await original(self, req, *args, **kwargs)

    pipeline.ChatPipeline.prepare = recording  # type: ignore[method-assign]
    try:
        with running_server(service) as url:
            served.url = url
            yield served
    finally:
        pipeline.ChatPipeline.prepare = original  # type: ignore[method-assign]


def _today() -> set[str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {now.date().isoformat(), now.astimezone().date().isoformat()}


def pin_dates(messages: list[Any]) -> None:
    """Today's date, wherever a message's text holds it, replaced by :data:`PINNED_DATE` (in place)."""

    def pinned(text: str) -> str:
        for today in _today():
            text = text.replace(today, PINNED_DATE)
        return text

    for message in messages:
        if isinstance(message.content, str):
            message.content = pinned(message.content)
        elif isinstance(message.content, list):
            for part in message.content:
                if isinstance(part.get("text"), str):
                    part["text"] = pinned(part["text"])


def messages_text(message: dict[str, Any]) -> str:
    """A chat message's text, whatever the shape of its content."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return json.dumps(content) if content is not None else ""


def events(stdout: str) -> list[dict[str, Any]]:
    """The JSON events a CLI printed one per line (anything else skipped)."""
    out = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def task_folder(name: str) -> Path:
    """An empty folder at a fixed path for one task (the CLI's home; the files go in its ``work``).

    Fixed, not pytest's numbered ``tmp_path``: the path is in the prompt, and a greedy 1.5B model
    given other tokens may take another road (docs/integrations.md says how fragile it is), so a
    run must be the same run every time.
    """
    folder = TASKS / name
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "work").mkdir(parents=True)
    return folder
