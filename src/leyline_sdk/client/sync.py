"""The blocking client's session and blocks: thin wrappers that run the async core with ``drive``.

A :class:`SyncSession` is a :class:`~leyline_sdk.session.LeylineSession` (``core``) whose
requests are the blocking client's: ``create`` sends a turn through ``Leyline.chat.completions``,
``sync_edits`` and ``close`` run the core's coroutines without an event loop
(:func:`~leyline_sdk.client.routes.drive`). Every other attribute (``history``, ``stats``,
``session_id``, ``last_directives``, ...) is the core's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from leyline_sdk.client.routes import drive
from leyline_sdk.session.blocks import Block, Blocks
from leyline_sdk.session.session import LeylineSession
from leyline_sdk.session.stats import TurnStats

__all__ = ["SyncSession", "SyncBlocks"]


class SyncSession:
    """A session of the blocking ``Leyline`` client (see the module docstring)."""

    def __init__(self, core: LeylineSession, send: Callable[..., Any]) -> None:
        object.__setattr__(self, "core", core)
        object.__setattr__(self, "_send", send)

    core: LeylineSession

    def create(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Send the (full) history in this session (see ``LeylineSession.create``); blocking."""
        return self._send(self.core, model=model, messages=messages, tools=tools, stream=stream, **kwargs)

    def sync_edits(self, tools: Sequence[Mapping[str, Any]] | None = None) -> TurnStats | None:
        """Splice the policies' edits now, without generating (``LeylineSession.sync_edits``)."""
        return drive(self.core.sync_edits(tools))

    def close(self) -> None:
        """Delete the server-side session (a 404 is fine) and forget its base."""
        drive(self.core.aclose())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.core, name, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SyncSession) and other.core is self.core

    def __hash__(self) -> int:
        return id(self.core)


class SyncBlocks:
    """``Leyline.blocks``: the client's :class:`~leyline_sdk.session.blocks.Blocks`, blocking."""

    def __init__(self, blocks: Blocks) -> None:
        self.core = blocks

    def create(
        self,
        *,
        tokens: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Block:
        """Create a block from token ids, or from messages (``Blocks.create``)."""
        return drive(self.core.create(tokens=tokens, messages=messages, tools=tools))

    def retrieve(self, block_id: str) -> Block:
        """A block's tokens (``openai.NotFoundError`` if unknown or another key's)."""
        return drive(self.core.retrieve(block_id))

    def delete(self, block_id: str) -> None:
        """Delete a block (``openai.NotFoundError`` if unknown or another key's)."""
        drive(self.core.delete(block_id))

    def forget(self, block_id: str) -> None:
        """Stop reusing ``block_id``."""
        self.core.forget(block_id)
