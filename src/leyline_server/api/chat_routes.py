"""``POST /v1/chat/completions``: OpenAI's chat completions with the ``leyline`` extension, SSE or not."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from leyline_sdk.templates import Transcript
from leyline_server.api.decoder import TextDecoder
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import error_body
from leyline_server.api.params import sampling_params, stop_strings, tool_parsing
from leyline_server.api.responses import Completion, assistant_message, logprob_entry, sse, usage
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.service import ChatTurn, LeylineService
from leyline_server.engines.base import SamplingParams

__all__ = ["router", "ClosingStream"]

router = APIRouter()
log = logging.getLogger("leyline.api")


class ClosingStream(StreamingResponse):
    """A streaming response that always runs ``on_close`` — finished, abandoned or never iterated."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[Any]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                await aclose()
            await self._on_close()


def _finish(reason: str | None, decoder: TextDecoder, calls: list[dict[str, Any]]) -> str:
    if calls:
        return "tool_calls"
    return "stop" if decoder.stopped else (reason or "stop")


async def _complete(
    service: LeylineService,
    chat: ChatTurn,
    params: SamplingParams,
    decoder: TextDecoder,
    tools: dict[str, Any],
    completion: Completion,
) -> dict[str, Any]:
    reason: str | None = None
    logprobs: list[dict[str, Any]] | None = [] if params.logprobs else None
    async with aclosing(service.engine.stream(chat.turn, params)) as steps:
        async for step in steps:
            decoder.push(step.token)
            reason = step.finish_reason
            if logprobs is not None:
                logprobs.append(logprob_entry(service.tokenizer, step))
            if decoder.stopped:
                break
    message, calls = assistant_message(decoder.text(), tools["parse"], tools["parallel"])
    return completion.body(
        message,
        _finish(reason, decoder, calls),
        logprobs,
        usage=usage(chat.turn),
        leyline=service.result(chat).model_dump(mode="json"),
    )


async def _events(
    service: LeylineService,
    chat: ChatTurn,
    params: SamplingParams,
    decoder: TextDecoder,
    tools: dict[str, Any],
    completion: Completion,
    include_usage: bool,
) -> AsyncIterator[str]:
    try:
        yield completion.chunk({"role": "assistant", "content": ""})
        reason: str | None = None
        pending: list[dict[str, Any]] = []
        async with aclosing(service.engine.stream(chat.turn, params)) as steps:
            async for step in steps:
                delta = decoder.push(step.token)
                reason = step.finish_reason
                if params.logprobs:
                    pending.append(logprob_entry(service.tokenizer, step))
                if delta:
                    yield completion.chunk({"content": delta}, logprobs=pending)
                    pending = []
                if decoder.stopped:
                    break
        rest = decoder.rest()
        if rest or pending:
            yield completion.chunk({"content": rest}, logprobs=pending)
        _, calls = assistant_message(decoder.text(), tools["parse"], tools["parallel"])
        if calls:
            yield completion.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
        leyline = service.result(chat).model_dump(mode="json")
        yield completion.chunk({}, _finish(reason, decoder, calls), leyline=leyline)
        if include_usage:
            yield completion.usage_chunk(chat.turn)
    except Exception as exc:  # headers are sent: report in the stream, then end it
        log.exception("stream %s failed", completion.id)
        yield sse(error_body(500, "internal_error", f"generation failed: {exc}"))
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, key: Owner, service: Service) -> Any:
    """OpenAI's chat completion; ``leyline`` in the body asks for a session and directives."""
    service.check_model(body.model)
    rendered = service.render(body.messages, body.tools, generation=True)
    prompt = rendered.tokens
    params = sampling_params(body, len(prompt), service.context_tokens, service.engine.info.vocab_size)
    if body.max_tokens is None and body.max_completion_tokens is None and service.config.default_max_tokens:
        params.max_tokens = min(params.max_tokens, service.config.default_max_tokens)
    tools = tool_parsing(body)
    decoder = TextDecoder(service.tokenizer, service.engine.info.eos_token_ids, stop_strings(body), tools["parse"])
    completion = Completion(body.model)
    stack = AsyncExitStack()
    transcript = Transcript([m.model_dump(exclude_none=True) for m in body.messages], body.tools, rendered)
    chat = await stack.enter_async_context(service.chat_turn(body.leyline, key, prompt, transcript))
    if not body.stream:
        async with stack:
            return await _complete(service, chat, params, decoder, tools, completion)
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    events = _events(service, chat, params, decoder, tools, completion, include_usage)
    return ClosingStream(events, stack.aclose, media_type="text/event-stream")
