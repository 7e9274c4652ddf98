"""The sessions and blocks routes' operations (``/v1/leyline/sessions``, ``/v1/leyline/blocks``).

A part of :class:`~leyline_server.api.service.LeylineService` (its base class): open a session or a
block on prefilled tokens, find one, splice a session without generating. The chat turn's steps
live in the service itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from leyline_sdk.core.directives import Directive
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import BaseRef, FallbackInfo
from leyline_server.api.admission import Ticket
from leyline_server.api.config import ServerConfig
from leyline_server.api.conversations import Conversations
from leyline_server.api.errors import APIError
from leyline_server.api.limits import check_directives, check_tokens, overflow, result_length
from leyline_server.api.metrics import Metrics
from leyline_server.api.room import Room
from leyline_server.blocks import Block, BlockStore
from leyline_server.contract.base import Engine
from leyline_server.contract.values import CacheScope, CapacityError, Handle, SpliceRequest
from leyline_server.sessions import Session, SessionStore
from leyline_server.splice import SpliceError, SpliceReport, strict_status

__all__ = ["SessionOps"]


class SessionOps:
    """The sessions and blocks routes' operations, and the splice metrics every splice records."""

    engine: Engine
    config: ServerConfig
    metrics: Metrics
    sessions: SessionStore
    blocks: BlockStore
    conversations: Conversations
    room: Room

    @property
    def context_tokens(self) -> int:  # the service's
        raise NotImplementedError

    def salt(self, owner: str | None) -> str | None:  # the service's
        raise NotImplementedError

    def _record(self, report: SpliceReport | None) -> None:
        if report is None:
            return
        fb = report.fallback
        self.metrics.splices.labels("fallback" if fb else "applied", fb.code if fb else "").inc()
        self.metrics.splice_ms.observe(report.splice_ms)

    def _splice_error(self, exc: SpliceError, param: str) -> APIError:
        self.metrics.splices.labels("error", exc.code.value).inc()
        return APIError(strict_status(exc.code), exc.code.value, exc.message, param)

    async def open_session(self, owner: str | None, tokens: list[int], ticket: Ticket) -> Session:
        """Prefill ``tokens`` and open a session on them."""
        if not tokens:
            raise APIError(400, "empty_session", "a session needs at least one token", "tokens")
        check_tokens(tokens, self.engine.info.vocab_size, self.context_tokens, "tokens")
        await self.room.reserve(ticket, len(tokens))
        session = self.sessions.open(owner, self.salt(owner))
        async with self.sessions.use(session):

            async def attempt(_: bool) -> Handle:
                return await self.engine.open(tokens, session.scope, owner)

            try:
                session.handle = await self.room.retry(attempt, len(tokens), keep=session)
            except BaseException:
                self.sessions.drop(session)
                raise
        return session

    def get_session(self, session_id: str, owner: str | None) -> Session:
        """The caller's session or 404 (also for another key's session)."""
        session = self.sessions.get(session_id, owner)
        if session is None:
            raise APIError(
                404, FallbackCode.SESSION_NOT_FOUND.value, f"unknown or expired session {session_id!r}", "session_id"
            )
        return session

    async def splice_session(
        self,
        session_id: str,
        owner: str | None,
        directives: list[Directive],
        base: BaseRef | None,
        strict: bool,
        ticket: Ticket,
    ) -> tuple[Session, SpliceReport]:
        """Splice a session without generating; a result longer than the context is not applied
        (422 when strict), like any other directive that cannot apply."""
        check_directives(self.config, directives, "directives")
        session = self.get_session(session_id, owner)
        async with self.sessions.use(session):
            if session.handle is None:
                raise APIError(
                    404, FallbackCode.SESSION_NOT_FOUND.value, f"session {session_id!r} holds no cache", "session_id"
                )
            self.conversations.forget(session)
            with self.blocks.using((d.block for d in directives), owner) as blocks:
                report = await self._splice_held(session, directives, base, strict, ticket, blocks)
        self._record(report)
        self.metrics.record_tokens(report.reused_tokens, report.rotated_tokens, report.prefilled_tokens, 0)
        return session, report

    async def _splice_held(
        self,
        session: Session,
        directives: list[Directive],
        base: BaseRef | None,
        strict: bool,
        ticket: Ticket,
        blocks: Mapping[str, Handle],
    ) -> SpliceReport:
        """The splice of a session the caller holds, with the blocks it names held too."""
        length = len(session.tokens)
        too_long = overflow(length, directives, blocks, self.context_tokens)
        if too_long is not None:
            i, message = too_long
            if strict:
                raise self._splice_error(SpliceError(FallbackCode.CONTEXT_LENGTH, message), f"directives.{i}")
            return SpliceReport(applied=False, fallback=FallbackInfo(code=FallbackCode.CONTEXT_LENGTH, message=message))
        await self.room.reserve(ticket, length + (result_length(length, directives, blocks) or 0))
        handle, session.handle = session.handle, None
        assert handle is not None
        ref = (base.length, base.digest) if base else (None, None)
        request = SpliceRequest(directives, ref[0], ref[1], strict, blocks=blocks)
        try:
            session.handle, report = await self.engine.splice(handle, request)
        except SpliceError as exc:
            session.handle = handle
            raise self._splice_error(exc, "directives") from exc
        except CapacityError as exc:
            self.sessions.drop(session)
            raise APIError(503, FallbackCode.CAPACITY.value, str(exc)) from exc
        return report

    async def open_block(self, owner: str | None, tokens: list[int], ticket: Ticket) -> Block:
        """Prefill ``tokens`` alone at positions ``[0, n)`` and keep them as a block."""
        if not tokens:
            raise APIError(400, "empty_block", "a block needs at least one token", "tokens")
        check_tokens(tokens, self.engine.info.vocab_size, self.context_tokens, "tokens")
        await self.room.reserve(ticket, len(tokens))
        block_id = self.blocks.new_id()
        scope = CacheScope(self.salt(owner), f"block:{block_id}")

        async def attempt(_: bool) -> Handle:
            return await self.engine.open(tokens, scope, owner)

        return self.blocks.add(block_id, owner, await self.room.retry(attempt, len(tokens), keep=None))

    def get_block(self, block_id: str, owner: str | None) -> Block:
        """The caller's block or 404 (also for another key's block)."""
        block = self.blocks.get(block_id, owner)
        if block is None:
            raise APIError(404, "block_not_found", f"unknown block {block_id!r}", "block_id")
        return block
