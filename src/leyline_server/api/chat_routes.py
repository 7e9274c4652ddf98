"""``POST /v1/chat/completions``: OpenAI's chat completions with the ``leyline`` extension, SSE or not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from leyline_server.api.decoder import TextDecoder
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.params import sampling_params, stop_strings, tool_parsing
from leyline_server.api.responses import Completion, assistant_message, logprob_entry, sse, usage
from leyline_server.api.schemas import ChatCompletionRequest
from leyline_server.api.service import ChatTurn, LeylineService
from leyline_server.engines.base import CapacityError, SamplingParams

__all__ = ["router", "ClosingStream"]

router = APIRouter()
log = logging.getLogger("leyline.api")


class StreamStalled(Exception):
    """The client stopped reading: a send waited past the stall timeout."""


class ClosingStream(StreamingResponse):
    """A streaming response that always runs ``on_close`` — finished, abandoned or never iterated.

    A client that stops reading pauses the stream (its sends wait; decoding stops ``RUN_AHEAD``
    steps later); past ``stall_timeout_s`` the stream is ended: the connection is closed and
    ``on_close`` commits what was generated, as for a client that went away.
    """

    def __init__(
        self,
        content: AsyncIterator[str],
        on_close: Callable[[], Awaitable[Any]],
        stall_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_close = on_close
        self._stall_timeout_s = stall_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_stall(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self._stall_timeout_s)
            except asyncio.TimeoutError as exc:
                raise StreamStalled from exc

        try:
            await super().__call__(scope, receive, send_or_stall)
        except StreamStalled:
            log.warning("stream ended: the client read nothing for %g s", self._stall_timeout_s)
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
    try:
        async with aclosing(service.engine.stream(chat.turn, params)) as steps:
            async for step in steps:
                decoder.push(step.token)
                reason = step.finish_reason
                if logprobs is not None:
                    logprobs.append(logprob_entry(service.tokenizer, step))
                if decoder.stopped:
                    break
    except CapacityError as exc:  # the pool ran out mid-decode: no room, not a bug
        raise APIError(503, "capacity", f"the KV pool ran out while decoding: {exc}") from exc
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
    except CapacityError as exc:  # headers are sent: report in the stream, then end it
        yield sse(error_body(503, "capacity", f"the KV pool ran out while decoding: {exc}"))
    except Exception as exc:
        log.exception("stream %s failed", completion.id)
        yield sse(error_body(500, "internal_error", f"generation failed: {exc}"))
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, key: Owner, service: Service) -> Any:
    """OpenAI's chat completion; ``leyline`` in the body asks for a session and directives."""
    service.check_model(body.model)
    stack = AsyncExitStack()
    try:
        ticket = await stack.enter_async_context(service.admission.slot(key))
        prompt = await service.prompt(key, body.messages, body.tools, body.leyline)
        params = sampling_params(body, len(prompt.tokens), service.context_tokens, service.engine.info.vocab_size)
        if body.max_tokens is None and body.max_completion_tokens is None and service.config.default_max_tokens:
            params.max_tokens = min(params.max_tokens, service.config.default_max_tokens)
        tools = tool_parsing(body)
        decoder = TextDecoder(service.tokenizer, service.engine.info.eos_token_ids, stop_strings(body), tools["parse"])
        turn = service.chat_turn(body.leyline, key, prompt, ticket, params.max_tokens)
        chat = await stack.enter_async_context(turn)
    except BaseException:
        await stack.aclose()
        raise
    completion = Completion(body.model)
    if not body.stream:
        async with stack:
            return await _complete(service, chat, params, decoder, tools, completion)
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    events = _events(service, chat, params, decoder, tools, completion, include_usage)
    stall = service.config.stream_stall_timeout_s
    return ClosingStream(events, stack.aclose, stall, media_type="text/event-stream")
