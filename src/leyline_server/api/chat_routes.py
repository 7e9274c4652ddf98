"""``POST /v1/chat/completions``: OpenAI's chat completions with the ``leyline`` extension, SSE or not.

The route parses, prepares the turn (:class:`~leyline_server.api.pipeline.ChatPipeline`) and answers
through :func:`~leyline_server.api.answer.respond` with :class:`ChatAnswer`: a stream's first chunk
(the assistant's role) goes out at admission, SSE comments keep it alive while the prompt is
prefilled, and its last chunk carries the ``leyline`` report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from leyline_server.api.answer import KEEP_ALIVE_COMMENT, respond
from leyline_server.api.completion_shapes import Completion, sse
from leyline_server.api.deps import ClientEdits, Owner, Pipeline
from leyline_server.api.errors import APIError, error_body
from leyline_server.api.pipeline import OpenTurn, PreparedTurn
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["router"]

router = APIRouter()


@dataclass
class ChatAnswer:
    """A chat completion's answer (:class:`~leyline_server.api.answer.Shape`): the body, or the chunks."""

    completion: Completion
    logprobs: bool
    include_usage: bool
    route: str = "/v1/chat/completions"
    server_error: str = "internal_error"

    def opening(self, prepared: PreparedTurn) -> Iterable[str]:
        """The first chunk: the assistant's role."""
        yield self.completion.chunk({"role": "assistant", "content": ""})

    def keep_alive(self) -> str:
        """An SSE comment."""
        return KEEP_ALIVE_COMMENT

    async def events(self, turn: OpenTurn) -> AsyncIterator[str]:
        """Content chunks, the tool calls, the last chunk (finish reason and ``leyline``), the usage."""
        completion, pending = self.completion, []
        async for delta in turn.deltas():
            if delta.logprob is not None:
                pending.append(delta.logprob)
            if delta.text:
                yield completion.chunk({"content": delta.text}, logprobs=pending)
                pending = []
        outcome = turn.outcome
        assert outcome is not None
        if turn.rest or pending:
            yield completion.chunk({"content": turn.rest}, logprobs=pending)
        if outcome.calls:
            yield completion.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(outcome.calls)]})
        yield completion.chunk({}, outcome.finish_reason, leyline=turn.result().model_dump(mode="json"))
        if self.include_usage:
            yield completion.usage_chunk(turn.chat.turn)

    def failure(self, exc: APIError) -> Iterable[str]:
        """The error object as a chunk."""
        yield sse(error_body(exc.status, exc.code, exc.message, exc.param))

    def ending(self) -> Iterable[str]:
        """``[DONE]``."""
        yield "data: [DONE]\n\n"

    async def whole(self, turn: OpenTurn) -> dict[str, Any]:
        """The ``chat.completion``."""
        entries = [delta.logprob async for delta in turn.deltas() if delta.logprob is not None]
        assert turn.outcome is not None
        outcome, leyline = turn.outcome, turn.result().model_dump(mode="json")
        logprobs = entries if self.logprobs else None
        return self.completion.body(
            outcome.message, outcome.finish_reason, logprobs, usage=turn.usage(), leyline=leyline
        )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, key: Owner, pipeline: Pipeline, request: Request, client_edits: ClientEdits = None
) -> Response:
    """OpenAI's chat completion; ``leyline`` in the body asks for a session and directives."""
    prepared = await pipeline.prepare(body, key, client_edits)
    completion = Completion(body.model, id=body.rid) if body.rid else Completion(body.model)
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    return await respond(
        request, prepared, ChatAnswer(completion, bool(body.logprobs), include_usage), bool(body.stream)
    )
