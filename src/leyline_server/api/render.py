"""Rendering requests, bounded and off the event loop.

Every chat-template render and tokenization a request causes runs here, on a small thread pool
(``render_threads``), one render at a time per key: a huge conversation holds one thread, never
the event loop, so ``/health`` and other keys' requests keep being answered. Bounds, in order:

* at most ``max_messages`` messages (400 ``too_many_messages``), before anything is rendered;
* the characters the messages hold, then the rendered text: at most ``CHARS_PER_TOKEN`` per
  token of context (400 ``context_length_exceeded``), before anything is tokenized;
* ``render_timeout_s`` seconds, checked before every template render (400 ``render_timeout``).

Cost: the prompt of a chat request (:meth:`RenderService.tokens`) is one template render and one
tokenization, linear in the conversation. Per-message spans (``/tokenize``, blocks, auto-splice)
need one render per message prefix; they come from an
:class:`~leyline_sdk.render.incremental.IncrementalRenderer` started from the last rendering of the same
conversation (kept per key, least recently used first out), so a conversation's next turn
renders its new messages only.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from leyline_sdk.core.errors import RenderError
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.render.incremental import IncrementalRenderer, Snapshot
from leyline_sdk.render.rendering import HFChatTokenizer, RenderedConversation, normalize_messages
from leyline_server.api.config import CHARS_PER_TOKEN, ServerConfig
from leyline_server.api.errors import APIError
from leyline_server.api.schemas import check_content

__all__ = ["RenderService", "RenderTimeout", "BoundedChat", "PromptShape", "message_digests"]

T = TypeVar("T")
SNAPSHOT_BUDGET = 8 * 2**20  # bytes (estimated) of renderings kept for incremental renders, all keys


@dataclass(frozen=True)
class PromptShape:
    """How a chat request's prompt departs from a plain render of its messages.

    ``template_kwargs``: extra chat template variables; ``continue_final``: the final (assistant)
    message is not rendered as a message but appended as text, so the model continues it
    (SGLang's ``continue_final_message``; :mod:`.prompting` checks the request).
    """

    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    continue_final: bool = False


class RenderTimeout(RenderError):
    """A render ran past its deadline."""


class BoundedChat(HFChatTokenizer):
    """:class:`HFChatTokenizer` whose every template render first checks ``deadline`` (monotonic)."""

    deadline: float = math.inf

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The template's text (see :meth:`HFChatTokenizer.render_text`); :class:`RenderTimeout` past the deadline."""
        if time.monotonic() > self.deadline:
            raise RenderTimeout("rendering the messages took longer than the server's limit")
        return super().render_text(messages, tools, add_generation_prompt)

    def until(self, seconds: float) -> BoundedChat:
        """A copy whose renders stop ``seconds`` from now."""
        bounded = copy.copy(self)
        bounded.deadline = time.monotonic() + seconds
        return bounded


def message_digests(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> list[str]:
    """``d[i]`` identifies ``(tools, messages[:i])`` (a chained sha256; ``len(messages) + 1`` entries)."""
    h = hashlib.sha256(_canonical(tools).encode())
    out = [h.hexdigest()]
    for message in messages:
        h = hashlib.sha256((out[-1] + _canonical(message)).encode())
        out.append(h.hexdigest())
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _chars(value: Any) -> int:
    """Characters in every string (keys included) of a JSON-like value."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            total += sum(len(str(k)) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


class _Snapshots:
    """Renderings of conversations by (key, digest of tools + messages), least recently used out."""

    def __init__(self, budget: int = SNAPSHOT_BUDGET) -> None:
        self._items: OrderedDict[tuple[str | None, str], Snapshot] = OrderedDict()
        self._cost = 0
        self.budget = budget

    @staticmethod
    def _size(snapshot: Snapshot) -> int:
        """Bytes it holds, roughly: its text, its token and bound lists, its messages."""
        lists = len(snapshot.tokens) + len(snapshot.char_bounds) + len(snapshot.token_bounds)
        return len(snapshot.text) + 40 * lists + _chars(snapshot.messages) + 400 * len(snapshot.messages)

    def find(self, owner: str | None, digests: Sequence[str]) -> Snapshot | None:
        """The rendering of the longest prefix of the conversation that is kept."""
        for d in reversed(digests):
            found = self._items.get((owner, d))
            if found is not None:
                self._items.move_to_end((owner, d))
                return found
        return None

    def put(self, owner: str | None, digest: str, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (dropping the least recently used past the budget)."""
        old = self._items.pop((owner, digest), None)
        self._cost -= self._size(old) if old else 0
        self._items[(owner, digest)] = snapshot
        self._cost += self._size(snapshot)
        while self._cost > self.budget and self._items:
            _, dropped = self._items.popitem(last=False)
            self._cost -= self._size(dropped)


class RenderService:
    """The server's chat rendering; see the module docstring."""

    def __init__(self, tokenizer: Any, config: ServerConfig, context_tokens: int) -> None:
        self.chat = BoundedChat(tokenizer)
        self.config = config
        self.max_chars = CHARS_PER_TOKEN * context_tokens
        self._pool = ThreadPoolExecutor(config.render_threads, thread_name_prefix="leyline-render")
        self._locks: dict[str | None, tuple[asyncio.Lock, list[int]]] = {}
        self._snapshots = _Snapshots()
        self.full_renders = 0  # span renders from scratch (one template render per message)
        self.incremental_renders = 0  # span renders that started from the conversation's last one

    def check(self, messages: Sequence[Any], tools: Sequence[Any] | None, param: str = "messages") -> None:
        """The early bounds: message count, then characters (400 before any render)."""
        if len(messages) > self.config.max_messages:
            raise APIError(
                400, "too_many_messages", f"{len(messages)} messages; at most {self.config.max_messages}", param
            )
        check_content(messages, param)
        chars = _chars([m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m for m in messages])
        chars += _chars(list(tools or []))
        if chars > self.max_chars:
            raise APIError(400, FallbackCode.CONTEXT_LENGTH.value, self._too_long(chars), param)

    def _too_long(self, chars: int) -> str:
        return (
            f"the messages hold {chars} characters; at most {self.max_chars} "
            f"({CHARS_PER_TOKEN} per token of context) are rendered"
        )

    def _check_text(self, text: str) -> None:
        if len(text) > self.max_chars:
            raise APIError(400, FallbackCode.CONTEXT_LENGTH.value, self._too_long(len(text)), "messages")

    async def run(self, owner: str | None, job: Callable[[BoundedChat], T]) -> T:
        """``job(chat)`` on a render thread, one at a time per key; template errors are 400s."""
        lock, users = self._locks.setdefault(owner, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave(owner, users)
            raise
        chat = self.chat.until(self.config.render_timeout_s)
        future = asyncio.get_running_loop().run_in_executor(self._pool, job, chat)

        def done(_: object) -> None:  # the lock is held until the thread is done, even if the request is not
            lock.release()
            self._leave(owner, users)

        future.add_done_callback(done)
        try:
            return await asyncio.shield(future)
        except RenderTimeout as exc:
            limit = self.config.render_timeout_s
            raise APIError(400, "render_timeout", f"rendering took over {limit:g} s: {exc}", "messages") from exc
        except RenderError as exc:
            raise APIError(400, "invalid_messages", str(exc), "messages") from exc

    def _leave(self, owner: str | None, users: list[int]) -> None:
        users[0] -= 1
        if not users[0]:
            self._locks.pop(owner, None)

    async def tokens(
        self,
        owner: str | None,
        messages: Sequence[Any],
        tools: Sequence[Any] | None,
        generation: bool,
        shape: PromptShape | None = None,
    ) -> list[int]:
        """The prompt's tokens: one template render, one tokenization (see :class:`PromptShape`)."""
        self.check(messages, tools)

        def job(chat: BoundedChat) -> list[int]:
            renderer = chat.with_template_kwargs(shape.template_kwargs) if shape else chat
            msgs = normalize_messages(messages)
            continued = msgs.pop()["content"] if shape and shape.continue_final else ""
            text = renderer.render_text(msgs, tools, generation)
            self._check_text(text + continued)
            return renderer.encode(text)[0] + (renderer.encode(continued)[0] if continued else [])

        return await self.run(owner, job)

    async def spans(
        self,
        owner: str | None,
        messages: Sequence[Any],
        tools: Sequence[Any] | None,
        generation: bool,
        start: Snapshot | None = None,
    ) -> tuple[RenderedConversation, Snapshot | None]:
        """Tokens and per-message spans (exactly :meth:`HFChatTokenizer.render`'s), and the snapshot
        the next turn starts from; incremental from ``start`` or the key's last rendering of it."""
        self.check(messages, tools)
        msgs = normalize_messages(messages)
        tool_list = list(tools) if tools else None
        digests = message_digests(msgs, tool_list)

        def job(chat: BoundedChat) -> tuple[RenderedConversation, Snapshot | None, bool]:
            renderer = IncrementalRenderer(chat)
            renderer.snapshot = start or self._snapshots.find(owner, digests)
            rendered = renderer.render(msgs, tool_list, generation)
            return rendered, renderer.snapshot, renderer.incremental_renders > 0

        rendered, snapshot, incremental = await self.run(owner, job)
        self.incremental_renders += incremental
        self.full_renders += not incremental
        if snapshot is not None:
            self._snapshots.put(owner, digests[-1], snapshot)
        return rendered, snapshot

    async def block_tokens(self, owner: str | None, messages: Sequence[Any], tools: Sequence[Any] | None) -> list[int]:
        """The messages' own tokens as the template renders them, without its preamble."""
        rendered, _ = await self.spans(owner, messages, tools, False)
        spans = rendered.message_spans
        return rendered.tokens[spans[0].start : spans[-1].end]

    def close(self) -> None:
        """Stop the render threads (running renders finish first)."""
        self._pool.shutdown(wait=True)
