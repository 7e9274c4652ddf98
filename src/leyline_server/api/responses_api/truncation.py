"""``truncation: "auto"``: the oldest messages dropped until the prompt fits the context.

Dropping is an edit like any other: the conversation is still recognised (its latest reply is
kept), the dropped span is spliced under the client-edits opt-in and recomputed otherwise. The
smallest number of whole exchanges (a user message, or an assistant message with the tool
results that answer it) is found by bisection, each try one render; system messages and the last
exchange are never dropped.
"""

from __future__ import annotations

from typing import Any

from leyline_sdk.core.fallbacks import FallbackCode
from leyline_server.api.errors import APIError
from leyline_server.api.pipeline import ChatPipeline, PreparedTurn
from leyline_server.api.schemas import ChatCompletionRequest

__all__ = ["open_fitting"]


def _starts(messages: list[dict[str, Any]]) -> list[int]:
    """Start indices of every exchange after the leading system messages, the last one included."""
    starts, i = [], 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    while i < len(messages):
        starts.append(i)
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            i += 1
    return starts


def _without(messages: list[dict[str, Any]], starts: list[int], k: int) -> list[dict[str, Any]]:
    """``messages`` without the first ``k`` exchanges (``starts``: every exchange's, the last one's
    included, which is never dropped: ``k < len(starts)``)."""
    if k == 0:
        return messages
    return messages[: starts[0]] + messages[starts[k] :]


async def open_fitting(
    pipeline: ChatPipeline, req: ChatCompletionRequest, owner: str | None, client_edits: str | None, truncate: bool
) -> tuple[PreparedTurn, int]:
    """The turn for ``req`` (recognising its conversation), prepared (not prefilled yet); with
    ``truncate``, the fewest oldest exchanges dropped for it to fit. Returns the turn and how many
    messages were dropped."""
    try:
        return await pipeline.prepare(req, owner, client_edits, recognise=True), 0
    except APIError as exc:
        if not truncate or exc.code != FallbackCode.CONTEXT_LENGTH.value:
            raise
        first = exc
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    starts = _starts(messages)
    lo, hi, best = 1, len(starts) - 1, None
    while lo <= hi:  # the fewest exchanges whose dropping fits: renders only, no turn started
        k = (lo + hi) // 2
        if await pipeline.fits(_trial(req, messages, starts, k), owner):
            best, hi = k, k - 1
        else:
            lo = k + 1
    if best is None:
        raise first
    kept = _without(messages, starts, best)
    prepared = await pipeline.prepare(_trial(req, messages, starts, best), owner, client_edits, recognise=True)
    return prepared, len(messages) - len(kept)


def _trial(
    req: ChatCompletionRequest, messages: list[dict[str, Any]], starts: list[int], k: int
) -> ChatCompletionRequest:
    body = {**req.model_dump(exclude_none=True), "messages": _without(messages, starts, k)}
    return ChatCompletionRequest.model_validate(body)
