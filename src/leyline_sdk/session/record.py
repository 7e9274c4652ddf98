"""Reading a session's answer: the turn's stats, and the server's session and base when they check out."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from leyline_sdk.core.directives import digest
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import LeylineResult
from leyline_sdk.explain.identity import reply_mark
from leyline_sdk.session.blocks import Blocks
from leyline_sdk.session.port import LeylineRoutes
from leyline_sdk.session.server_view import ServerView
from leyline_sdk.session.stats import TurnStats
from leyline_sdk.session.turn import PreparedTurn

__all__ = ["record_turn"]


class Recorded(Protocol):
    """What recording uses of a session: where the answer goes."""

    server: ServerView
    stats: list[TurnStats]
    strict: bool
    routes: LeylineRoutes
    blocks: Blocks


def record_turn(
    session: Recorded,
    turn: PreparedTurn,
    leyline: Mapping[str, Any] | None,
    usage: Any,
    completion: Any = None,
    reply: Mapping[str, Any] | None = None,
) -> TurnStats:
    """Stats of a finished request; adopt the server's session, base and reply when they check out.

    ``leyline`` is the response's ``leyline`` field (a stream's last one), ``usage`` its usage,
    ``completion`` the response itself (carried by a strict session's error), ``reply`` the
    assistant message it returned (its mark identifies the conversation later:
    :mod:`leyline_sdk.explain.identity`).
    """
    view = session.server
    stats = TurnStats.of_turn(len(session.stats) + 1, turn, usage)
    result = LeylineResult.model_validate(leyline) if leyline is not None else None
    if result is not None and turn.prompt is not None:
        _adopt(session, turn, result, stats)
    mark = reply_mark(reply) if reply is not None else None
    if mark is not None:
        view.replies.append(mark)
    stats.elapsed_ms = (time.perf_counter() - turn.started) * 1e3
    stats.prepare_ms = max(turn.prepared - turn.started, 0.0) * 1e3
    session.stats.append(stats)
    if view.unrecorded is turn:
        view.unrecorded = None
    if session.strict and result is not None and result.fallback is not None:
        raise session.routes.fallback_error(result.fallback.code, result.fallback.message, completion)
    return stats


def _adopt(session: Recorded, turn: PreparedTurn, result: LeylineResult, stats: TurnStats) -> None:
    """Count the server's tokens; adopt its session id and the new base if our tokens agree."""
    assert turn.prompt is not None
    view = session.server
    stats.count(result)
    stats.fallback = result.fallback.code if result.fallback else stats.fallback
    if result.fallback is not None and turn.block_ids:  # verify those blocks before reusing them
        session.blocks.suspect(turn.block_ids)
    if result.session_id and result.session_id != view.session_id:
        view.replies = []  # a new server session: its conversation starts here
    view.session_id = result.session_id or view.session_id
    tokens = turn.prompt.tokens + result.completion_token_ids
    server_digest = result.base.digest if result.base else None
    if server_digest is not None and server_digest == digest(tokens):
        view.adopt(tokens, server_digest, list(turn.effective), turn.prompt)
    else:  # our rendering disagrees with the server's: no directives until it agrees again
        view.forget_base()
        stats.fallback = stats.fallback or FallbackCode.TOKENIZER_MISMATCH.value
