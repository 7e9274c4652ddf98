"""How a chat request shapes its prompt beyond its messages: the template variables it sets
(``chat_template_kwargs``, ``reasoning_effort``) and SGLang's ``continue_final_message``.

``continue_final_message`` (as SGLang does it): the conversation without its final assistant
message is rendered with the generation prompt, and that message's text is appended as tokens,
so the model continues it instead of starting a new message. The render itself happens off the
event loop (:meth:`leyline_server.api.render.RenderService.tokens`).
"""

from __future__ import annotations

import json
from typing import Any

from leyline_server.api.errors import APIError
from leyline_server.api.params import template_kwargs
from leyline_server.api.render import PromptShape
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["REASONING_SWITCHES", "prompt_shape", "reasoning_effort_for", "template_source"]

REASONING_SWITCHES = ("reasoning_effort", "thinking", "enable_thinking")
"""Names a chat template reads to turn reasoning on or off; one of them in its source means it has a switch."""


def template_source(chat: Any) -> str:
    """The chat template's source text (a JSON dump when the tokenizer keeps several)."""
    source = getattr(chat.tokenizer, "chat_template", "") or ""
    return source if isinstance(source, str) else json.dumps(source)


def reasoning_effort_for(effort: str | None, template: str) -> str | None:
    """The chat request's ``reasoning_effort`` for a protocol's effort: kept only where the template
    (its ``template`` source) has a reasoning switch to set, ``None`` otherwise."""
    if effort is not None and any(name in template for name in REASONING_SWITCHES):
        return effort
    return None


def prompt_shape(chat: Any, req: ChatCompletionRequest) -> PromptShape | None:
    """The request's :class:`PromptShape` (``None``: a plain render); 400 naming a field it cannot honour."""
    kwargs = template_kwargs(req, template_source(chat))
    if req.continue_final_message:
        last = req.messages[-1]
        if last.role != "assistant" or not isinstance(last.content, str) or len(req.messages) < 2:
            raise APIError(
                400,
                "invalid_request",
                "continue_final_message needs a final assistant message with text content after another message",
                "continue_final_message",
            )
    if not kwargs and not req.continue_final_message:
        return None
    return PromptShape(kwargs, bool(req.continue_final_message))
