"""``POST /v1/chat/completions``: OpenAI's chat completions with the ``leyline`` extension, SSE or not."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from leyline_server.api.constraints import plan_constraint
from leyline_server.api.decoder import TextDecoder
from leyline_server.api.deps import Owner, Service
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.params import check_request, sampling_params, stop_strings
from leyline_server.api.prompting import build_prompt
from leyline_server.api.responses import Completion, logprob_entry, sse, usage
from leyline_server.api.schemas import ChatCompletionRequest, check_content
from leyline_server.api.service import ChatTurn, LeylineService
from leyline_server.api.tools import ToolPlan, plan_tools
from leyline_server.engines.base import Constraint, ConstraintError, SamplingParams

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


async def _complete(
    service: LeylineService,
    chat: ChatTurn,
    params: SamplingParams,
    decoder: TextDecoder,
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
    outcome = decoder.outcome(reason)
    return completion.body(
        outcome.message,
        outcome.finish_reason,
        logprobs,
        usage=usage(chat.turn),
        leyline=service.result(chat).model_dump(mode="json"),
    )


async def _events(
    service: LeylineService,
    chat: ChatTurn,
    params: SamplingParams,
    decoder: TextDecoder,
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
        outcome = decoder.outcome(reason)
        rest = decoder.rest(outcome)
        if rest or pending:
            yield completion.chunk({"content": rest}, logprobs=pending)
        if outcome.calls:
            yield completion.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(outcome.calls)]})
        leyline = service.result(chat).model_dump(mode="json")
        yield completion.chunk({}, outcome.finish_reason, leyline=leyline)
        if include_usage:
            yield completion.usage_chunk(chat.turn)
    except Exception as exc:  # headers are sent: report in the stream, then end it
        log.exception("stream %s failed", completion.id)
        yield sse(error_body(500, "internal_error", f"generation failed: {exc}"))
    yield "data: [DONE]\n\n"


async def _constraint(service: LeylineService, body: ChatCompletionRequest, tools: ToolPlan) -> Constraint | None:
    """The request's output constraint, compiled once here so that a bad one is a 400 naming its field."""
    plan = plan_constraint(service.chat, tools, body.response_format, body.regex, body.ebnf)
    if plan is None:
        return None
    try:
        await service.engine.check_constraint(plan.constraint)
    except ConstraintError as exc:
        raise APIError(400, "invalid_constraint", str(exc), plan.param) from exc
    return plan.constraint


def _decoder(
    service: LeylineService, body: ChatCompletionRequest, params: SamplingParams, tools: ToolPlan
) -> TextDecoder:
    eos = () if params.ignore_eos else service.engine.info.eos_token_ids
    return TextDecoder(
        service.tokenizer,
        [*eos, *params.stop_token_ids],
        stop_strings(body),
        parse_tools=tools.parse,
        parallel=tools.parallel,
        skip_special=body.skip_special_tokens is not False,
        keep_stop=bool(body.no_stop_trim),
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, key: Owner, service: Service) -> Any:
    """OpenAI's chat completion; ``leyline`` in the body asks for a session and directives."""
    service.check_model(body.model)
    check_request(body)
    check_content(body.messages)
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    prompt, transcript = build_prompt(service.chat, body)
    constraint = await _constraint(service, body, tools)
    params = sampling_params(body, len(prompt), service.context_tokens, service.engine.info.vocab_size, constraint)
    if body.max_tokens is None and body.max_completion_tokens is None and service.config.default_max_tokens:
        params.max_tokens = min(params.max_tokens, service.config.default_max_tokens)
    decoder = _decoder(service, body, params, tools)
    completion = Completion(body.model, id=body.rid) if body.rid else Completion(body.model)
    stack = AsyncExitStack()
    chat = await stack.enter_async_context(service.chat_turn(body.leyline, key, prompt, transcript))
    if not body.stream:
        async with stack:
            return await _complete(service, chat, params, decoder, completion)
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    events = _events(service, chat, params, decoder, completion, include_usage)
    return ClosingStream(events, stack.aclose, media_type="text/event-stream")
