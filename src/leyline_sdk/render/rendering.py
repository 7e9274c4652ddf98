"""Chat rendering: messages (+ tools) -> token ids with each message's exact token span.

The SDK diffs conversations per message, so it must know which tokens each message owns. A
:class:`ChatTokenizer` renders a conversation and reports those spans; where the chat template is
not *prefix-stable* (rendering more messages changes how earlier ones render, or a token straddles
a message boundary) the result says so in ``prefix_stable``/``unstable_reason`` instead of
guessing, and the differ then falls back to ``forget``.

Spans partition the rendered prompt: the *head* ``[0, spans[0].start)`` holds any template
preamble (tool definitions; empty when the template cannot render zero messages), message ``i``
owns ``[spans[i].start, spans[i].end)`` and each span ends where the next begins. The generation
prompt, if any, is the *tail* ``[spans[-1].end, len(tokens))``.
"""

from __future__ import annotations

import bisect
import copy
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from leyline_sdk.core.errors import RenderError
from leyline_sdk.render import template_data
from leyline_sdk.render.tool_text import ToolSupport, to_text_form, with_object_arguments

__all__ = ["Span", "RenderedConversation", "RenderDetail", "ChatTokenizer", "HFChatTokenizer", "normalize_messages"]


class Span(BaseModel):
    """Half-open token range ``[start, end)``."""

    model_config = ConfigDict(frozen=True)

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


class RenderedConversation(BaseModel):
    """A rendered conversation: its token ids and the token span of every message."""

    model_config = ConfigDict(frozen=True)

    tokens: list[int]
    message_spans: list[Span]
    prefix_stable: bool = True
    unstable_reason: str | None = None

    @property
    def head(self) -> Span:
        """Tokens before the first message (template preamble), possibly empty."""
        return Span(start=0, end=self.message_spans[0].start if self.message_spans else 0)

    @property
    def tail(self) -> Span:
        """Tokens after the last message (the generation prompt), possibly empty."""
        start = self.message_spans[-1].end if self.message_spans else 0
        return Span(start=start, end=len(self.tokens))

    def message_tokens(self, index: int) -> list[int]:
        """The token ids owned by message ``index``."""
        span = self.message_spans[index]
        return self.tokens[span.start : span.end]


@dataclass(frozen=True)
class RenderDetail:
    """A rendering with what it was cut from: the template's text and the cell bounds.

    ``char_bounds`` and ``token_bounds`` are ``[0, head end, end of message 0, …, end of the last
    message]`` in characters of ``text`` and in tokens; ``preamble`` is what the template renders
    for zero messages. An incremental renderer keeps this to avoid rendering a history twice.
    """

    conversation: RenderedConversation
    text: str
    char_bounds: list[int]
    token_bounds: list[int]
    preamble: str


@runtime_checkable
class ChatTokenizer(Protocol):
    """Anything that renders chat messages to tokens with per-message spans."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedConversation:
        """Render ``messages`` (OpenAI chat format) and ``tools`` to tokens and spans."""
        ...


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain dicts from OpenAI-format messages (dicts or pydantic models), ``None`` fields dropped."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message, BaseModel):
            message = message.model_dump(exclude_none=True)
        if not isinstance(message, Mapping):
            raise RenderError(f"messages[{i}] must be a mapping, got {type(message).__name__}")
        if "role" not in message:
            raise RenderError(f"messages[{i}] has no 'role'")
        out.append({k: v for k, v in message.items() if v is not None})
    return out


class HFChatTokenizer:
    """:class:`ChatTokenizer` over any transformers tokenizer that has a chat template.

    Spans come from rendering each message prefix as text (``apply_chat_template`` with
    ``tokenize=False``), checking that every prefix text is a prefix of the full text, and mapping
    the character boundaries onto one tokenization of the full text (offset mapping). The cost is
    one template render per message; tokenization happens once.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("a fast tokenizer (offset mapping) is required")
        self.tokenizer = tokenizer
        # transformers' own renderer (what apply_chat_template uses), minus its refusal of an
        # empty conversation, which we need to find the template's preamble.
        from transformers.utils.chat_template_utils import render_jinja_template

        self._render_jinja: Any = render_jinja_template
        self._local = threading.local()  # .prepared: this thread's TemplateData inside prepared_once
        self.template_kwargs: dict[str, Any] = {}
        self.isolated_tokens = _isolated_tokens(tokenizer)
        self.tool_support = self._probe_tools()

    def with_template_kwargs(self, kwargs: Mapping[str, Any]) -> HFChatTokenizer:
        """This renderer with extra chat template variables (``chat_template_kwargs``); ``self`` if none."""
        if not kwargs:
            return self
        other = copy.copy(self)
        other.template_kwargs = {**self.template_kwargs, **kwargs}
        return other

    def _probe_tools(self) -> ToolSupport:
        """What the template renders of OpenAI's tool shapes (else :mod:`leyline_sdk.render.tool_text` steps in)."""

        def renders(messages: list[dict[str, Any]], needle: str, tools: list[dict[str, Any]] | None = None) -> bool:
            try:
                return needle in self._render(messages, tools, False)
            except RenderError:
                return False

        user = {"role": "user", "content": "x"}
        fn = {"type": "function", "function": {"name": "leyline_probe_fn", "parameters": {"type": "object"}}}
        call = {"id": "c", "type": "function", "function": {"name": "leyline_probe_call", "arguments": "{}"}}
        # a template that writes ``arguments | tojson`` turns text into a quoted, escaped string
        quoted = {**call, "function": {"name": "leyline_probe_call", "arguments": '{"leyline_probe_arg": 1}'}}
        return ToolSupport(
            definitions=renders([user], "leyline_probe_fn", [fn]),
            calls=renders([user, {"role": "assistant", "content": None, "tool_calls": [call]}], "leyline_probe_call"),
            tool_role=renders(
                [user, {"role": "tool", "tool_call_id": "c", "content": "leyline_probe_out"}], "leyline_probe_out"
            ),
            object_arguments=renders(
                [user, {"role": "assistant", "content": None, "tool_calls": [quoted]}], '\\"leyline_probe_arg\\"'
            ),
        )

    def hard_split(self, text: str, pos: int) -> bool:
        """Whether tokenizing ``text`` is independent on both sides of ``pos``.

        True at the ends and next to an added token the tokenizer cuts out before anything else
        (not normalized, no whitespace stripping): tokenization never crosses those.
        """
        if pos <= 0 or pos >= len(text):
            return True
        return any(text.startswith(t, pos) or text.endswith(t, 0, pos) for t in self.isolated_tokens)

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's text for ``messages`` (no tokenization; zero messages allowed).

        Where the template lacks tool syntax, tool definitions, calls and results are rendered
        in the text form of :mod:`leyline_sdk.render.tool_text` (byte-stable).
        """
        if not self.tool_support.native:
            try:
                messages = to_text_form(messages, tools, self.tool_support)
            except (TypeError, AttributeError, ValueError, RecursionError) as exc:  # "tool_calls": "garbage"
                raise RenderError(f"tool calls or tools not in OpenAI's shape: {exc}") from exc
            tools = tools if self.tool_support.definitions else None
        elif self.tool_support.object_arguments:
            messages = [with_object_arguments(m) for m in messages]
        return self._render(messages, tools, add_generation_prompt)

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The template itself, nothing rewritten."""
        try:
            template = self.tokenizer.get_chat_template(None, list(tools) if tools else None)
            variables = {**self.tokenizer.special_tokens_map, **self.template_kwargs}
            prepared = self._prepared_for(tools, variables)
            if prepared is not None:
                tool_list = list(tools) if tools else None
                return prepared.render(template, messages, tool_list, add_generation_prompt, variables)
            rendered, _ = self._render_jinja(  # type: ignore[misc]  # transformers' untyped helper
                conversations=[list(messages)],
                tools=list(tools) if tools else None,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except Exception as exc:  # jinja raises many types; surface one
            raise RenderError(f"chat template failed: {exc}") from exc
        return str(rendered[0])

    @contextmanager
    def prepared_once(self) -> Iterator[None]:
        """Within the block, this thread's renders prepare each message dict's template input once.

        The caller promises that the message dicts it renders do not change during the block (the
        text is identical to transformers' renderer: see :mod:`leyline_sdk.render.template_data`).
        """
        if getattr(self._local, "prepared", None) is not None:
            yield
            return
        self._local.prepared = template_data.load()
        try:
            yield
        finally:
            self._local.prepared = None

    def _prepared_for(
        self, tools: Sequence[Mapping[str, Any]] | None, variables: Mapping[str, Any]
    ) -> template_data.TemplateData | None:
        """The block's TemplateData when this render is the plain case it reproduces exactly."""
        prepared = getattr(self._local, "prepared", None)
        if prepared is None or any(not isinstance(t, dict) for t in tools or ()):
            return None
        return None if _RENDERER_ARGUMENTS.intersection(variables) else prepared

    def _preamble(self, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The text the template renders for zero messages ("" if it cannot)."""
        try:
            return self.render_text([], tools, False)
        except RenderError:
            return ""

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and character offsets of ``text`` (no extra special tokens)."""
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedConversation:
        """Render and locate each message's tokens; see the module docstring for the contract."""
        return self.render_detail(messages, tools, add_generation_prompt).conversation

    def render_detail(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderDetail:
        """:meth:`render`, plus the text and the character and token bounds it was cut at."""
        msgs = normalize_messages(messages)
        if not msgs:
            raise RenderError("cannot render an empty conversation")
        with self.prepared_once():  # msgs are our own fresh dicts
            full = self.render_text(msgs, tools, add_generation_prompt)
            preamble = self._preamble(tools)
            head = preamble if full.startswith(preamble) else ""
            boundaries, reason = self._char_boundaries(msgs, tools, full, head, add_generation_prompt)
        tokens, offsets = self.encode(full)
        token_bounds = _char_to_token_boundaries(boundaries, offsets, len(full))
        if token_bounds is None:
            reason = reason or "a token straddles a message boundary"
            token_bounds = _nearest_token_boundaries(boundaries, offsets, len(tokens))
        spans = [Span(start=a, end=b) for a, b in zip(token_bounds[1:], token_bounds[2:], strict=False)]
        conversation = RenderedConversation.model_construct(
            tokens=tokens, message_spans=spans, prefix_stable=reason is None, unstable_reason=reason
        )
        return RenderDetail(conversation, full, boundaries, token_bounds, preamble)

    def _char_boundaries(
        self, msgs: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None, full: str, head: str, gen: bool
    ) -> tuple[list[int], str | None]:
        """``[0, head end, end of message 0, …]`` from one template render per message prefix."""
        reason: str | None = None
        previous = head
        boundaries = [0, len(head)]
        for i in range(1, len(msgs) + 1):
            text = full if (i == len(msgs) and not gen) else self.render_text(msgs[:i], tools, False)
            if not (text.startswith(previous) and full.startswith(text)):
                reason = reason or f"rendering message {i - 1} changes the text of earlier messages"
            boundaries.append(len(text))
            previous = text
        return boundaries, reason


# render_jinja_template's own keyword arguments: a template variable of one of these names would
# be taken as the argument, which only transformers' renderer reproduces.
_RENDERER_ARGUMENTS = frozenset(
    {"conversations", "tools", "documents", "chat_template", "return_assistant_tokens_mask"}
    | {"continue_final_message", "add_generation_prompt"}
)


def _isolated_tokens(tokenizer: Any) -> tuple[str, ...]:
    """Added tokens matched verbatim in the raw text (see :meth:`HFChatTokenizer.hard_split`)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    isolated = {
        t.content for t in added.values() if t.content and not (t.normalized or t.lstrip or t.rstrip or t.single_word)
    }
    return tuple(sorted(isolated, key=len, reverse=True))


def _token_starts(offsets: Sequence[tuple[int, int]]) -> list[int]:
    return [start for start, _ in offsets]


def _char_to_token_boundaries(
    char_bounds: Sequence[int], offsets: Sequence[tuple[int, int]], text_length: int
) -> list[int] | None:
    """Token index at each character boundary, or ``None`` if one falls inside a token."""
    starts = _token_starts(offsets)
    out: list[int] = []
    for c in char_bounds:
        if c >= text_length:
            out.append(len(offsets))
            continue
        k = bisect.bisect_left(starts, c)
        if k >= len(starts) or starts[k] != c or (k > 0 and offsets[k - 1][1] > c):
            return None
        out.append(k)
    return out


def _nearest_token_boundaries(
    char_bounds: Sequence[int], offsets: Sequence[tuple[int, int]], n_tokens: int
) -> list[int]:
    """Best-effort boundaries for an unstable rendering (monotone, clipped)."""
    starts = _token_starts(offsets)
    out = [min(bisect.bisect_left(starts, c), n_tokens) for c in char_bounds]
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    return out
