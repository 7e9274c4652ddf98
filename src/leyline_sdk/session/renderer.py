"""What a session needs to see its prompt as the server will: a :class:`Renderer`.

A renderer turns the effective messages into tokens with per-message spans, and answers
``None`` when the server does not speak Leyline (then there is nothing to splice and the session
sends plain OpenAI requests). Two implementations:

* :class:`LocalRenderer` — a local :class:`~leyline_sdk.render.rendering.ChatTokenizer` (no round trip);
  an :class:`~leyline_sdk.render.rendering.HFChatTokenizer` is rendered incrementally, one
  :class:`~leyline_sdk.render.incremental.IncrementalRenderer` per session. Whether the server speaks
  Leyline is asked once per client (:class:`LeylineProbe`).
* :class:`ServerRenderer` — the server's ``POST /leyline/tokenize``: one round trip per render,
  which is also the probe (a 404 means no Leyline).

Neither knows about sessions or the client; the client builds one renderer per session. Their
requests go through the client's :class:`~leyline_sdk.client.routes.LeylineRoutes` (openai's transport,
retries and errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from leyline_sdk.render.incremental import IncrementalRenderer
from leyline_sdk.render.rendering import ChatTokenizer, HFChatTokenizer, RenderedConversation, Span
from leyline_sdk.session.gateway import DEFAULT_ROUTING_HEADER, Gateway, detect_router
from leyline_sdk.session.port import LeylineRoutes

__all__ = ["Renderer", "LeylineProbe", "LocalRenderer", "ServerRenderer"]

TOKENIZE_PATH = "/leyline/tokenize"


@runtime_checkable
class Renderer(Protocol):
    """Renders a session's prompt; ``None`` when the server does not speak Leyline."""

    async def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RenderedConversation | None:
        """Tokens and spans of ``messages`` with the generation prompt, as the server renders them."""
        ...


class LeylineProbe:
    """Whether the server speaks Leyline: asked once (``POST /leyline/tokenize``), then remembered.

    ``gateway`` is set when requests pass a gateway that does not proxy Leyline's routes
    (``behind_router=True``, or SGLang's router detected after a 404: ``leyline_sdk.session.gateway``);
    the server then counts as speaking Leyline, through ``/v1/chat/completions`` alone.
    """

    def __init__(
        self,
        routes: LeylineRoutes,
        known: bool | None = None,
        base_url: str = "",
        routing_header: str = DEFAULT_ROUTING_HEADER,
        gateway: Gateway | None = None,
    ) -> None:
        self.routes = routes
        self.known = True if gateway is not None else known
        self.base_url = base_url
        self.routing_header = routing_header
        self.gateway = gateway
        self._detected = gateway is not None
        self._detecting = asyncio.Lock()  # concurrent first turns wait for one detection

    async def not_found(self) -> None:
        """A Leyline route answered 404: a router in front (gateway mode, logged once) or no Leyline."""
        async with self._detecting:  # uncontended (the blocking client's case) it never suspends
            if not self._detected:
                self._detected = True
                self.gateway = await detect_router(self.routes, self.base_url, self.routing_header)
            self.known = self.gateway is not None

    async def available(self) -> bool:
        """``True`` if the server has the Leyline routes (probed on first call) or is behind a router."""
        if self.known is None:
            try:
                await self.routes.post(TOKENIZE_PATH, {"messages": [{"role": "user", "content": ""}]})
                self.known = True
            except self.routes.not_found:
                await self.not_found()
        return bool(self.known)


class LocalRenderer:
    """Render with a local tokenizer; incremental for :class:`HFChatTokenizer` (see ``incremental``)."""

    def __init__(self, tokenizer: ChatTokenizer, probe: LeylineProbe) -> None:
        self.tokenizer: ChatTokenizer = (
            IncrementalRenderer(tokenizer) if isinstance(tokenizer, HFChatTokenizer) else tokenizer
        )
        self.probe = probe

    async def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RenderedConversation | None:
        """The local rendering, or ``None`` if the server does not speak Leyline."""
        if not await self.probe.available():
            return None
        return self.tokenizer.render(messages, tools=tools, add_generation_prompt=True)


class ServerRenderer:
    """Render through the server's ``/leyline/tokenize`` (one round trip; a 404 means no Leyline)."""

    def __init__(self, routes: LeylineRoutes, probe: LeylineProbe) -> None:
        self.routes = routes
        self.probe = probe

    async def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RenderedConversation | None:
        """The server's rendering, or ``None`` if it does not speak Leyline (or cannot be reached for it)."""
        if self.probe.known is False or self.probe.gateway is not None:
            return None
        body = {"messages": list(messages), "tools": list(tools) if tools else None, "add_generation_prompt": True}
        try:
            r = await self.routes.post(TOKENIZE_PATH, body)
        except self.routes.not_found:
            await self.probe.not_found()
            return None
        self.probe.known = True
        return RenderedConversation.model_construct(
            tokens=list(r["tokens"]),
            message_spans=[Span(start=s["start"], end=s["end"]) for s in r["message_spans"]],
            prefix_stable=bool(r.get("prefix_stable", True)),
            unstable_reason=r.get("unstable_reason"),
        )
