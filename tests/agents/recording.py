"""What the server answered, recorded for a test: the Messages API's final bodies, as sent.

The agents tests check Claude Code's output against the messages the server really sent it; the
recorder wraps ``messages_api.routes._final`` (the one function every non-streamed and streamed
Messages answer's final body passes through) for the length of a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from leyline_server.api.messages_api import routes

__all__ = ["messages_answered"]


@contextmanager
def messages_answered() -> Iterator[list[dict[str, Any]]]:
    """Every Messages body the server answers inside the block, in order."""
    answers: list[dict[str, Any]] = []
    original = routes._final

    def recording(*args: Any) -> dict[str, Any]:
        body = original(*args)
        answers.append(body)
        return body

    routes._final = recording  # type: ignore[assignment]
    try:
        yield answers
    finally:
        routes._final = original  # type: ignore[assignment]
