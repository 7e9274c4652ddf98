"""A chat request's prompt: its messages through the chat template, with the template variables it
sets (``chat_template_kwargs``, ``reasoning_effort``) and SGLang's ``continue_final_message``.

``continue_final_message`` (as SGLang does it): the conversation without its final assistant
message is rendered with the generation prompt, and that message's text is appended as tokens,
so the model continues it instead of starting a new message.
"""

from __future__ import annotations

import json
from typing import Any

from leyline_sdk.errors import RenderError
from leyline_sdk.templates import Transcript
from leyline_server.api.errors import APIError
from leyline_server.api.params import template_kwargs
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["build_prompt"]


def _template_source(chat: Any) -> str:
    source = getattr(chat.tokenizer, "chat_template", "") or ""
    return source if isinstance(source, str) else json.dumps(source)


def build_prompt(chat: Any, req: ChatCompletionRequest) -> tuple[list[int], Transcript]:
    """(prompt tokens, the transcript auto-splice compares turns with); 400 for what the template refuses."""
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    kwargs = template_kwargs(req, _template_source(chat))
    renderer = chat.with_template_kwargs(kwargs)
    prefix: list[int] = []
    if req.continue_final_message:
        last = messages[-1]
        if last.get("role") != "assistant" or not isinstance(last.get("content"), str) or len(messages) < 2:
            raise APIError(
                400,
                "invalid_request",
                "continue_final_message needs a final assistant message with text content after another message",
                "continue_final_message",
            )
        messages = messages[:-1]
        prefix = renderer.encode(last["content"])[0]
    try:
        rendered = renderer.render(messages, tools=req.tools, add_generation_prompt=True)
    except RenderError as exc:
        raise APIError(400, "invalid_messages", str(exc), "messages") from exc
    return rendered.tokens + prefix, Transcript(messages, req.tools, rendered)
