"""The server's behaviour behind the routes: sessions, splices, turns, limits. No HTTP here.

Threading: the event loop owns the session store; every touch of the KV cache happens inside
the engine (:class:`~leyline_server.engines.base.Engine`), which runs its own jobs. A request on
a session holds that session (:meth:`SessionStore.use`) from the splice to the end of decoding.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from leyline_sdk.directives import Directive, digest
from leyline_sdk.errors import RenderError
from leyline_sdk.rendering import HFChatTokenizer, RenderedConversation
from leyline_sdk.templates import Transcript
from leyline_sdk.wire import BaseRef, FallbackInfo, LeylineRequest, LeylineResult
from leyline_server.api.config import ServerConfig
from leyline_server.api.errors import APIError
from leyline_server.api.metrics import Metrics
from leyline_server.api.schemas import Message, check_content
from leyline_server.api.splicing import resolve_session, splice_request
from leyline_server.blocks import Block, BlockStore
from leyline_server.engines.base import CacheScope, CapacityError, Engine, Handle, SpliceRequest, Turn
from leyline_server.sessions import Session, SessionStore
from leyline_server.splice import SpliceError, SpliceReport, strict_status

__all__ = ["ServerConfig", "LeylineService", "ChatTurn"]


@dataclass
class ChatTurn:
    """A chat request in flight: the engine's turn, its session, and what to report."""

    turn: Turn
    session: Session | None
    fallback: FallbackInfo | None = None
    auto_splice: bool = False


class LeylineService:
    """Everything the HTTP routes do, minus HTTP."""

    def __init__(self, engine: Engine, tokenizer: Any, config: ServerConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat = HFChatTokenizer(tokenizer)
        self.config = config
        self.metrics = Metrics()
        self.blocks = BlockStore(release=engine.release, max_per_key=config.max_blocks_per_key)
        self.sessions = SessionStore(
            release=engine.release,
            ttl_s=config.session_ttl_s,
            max_sessions=config.max_sessions,
            max_per_key=config.max_sessions_per_key,
        )

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def context_tokens(self) -> int:
        """The context limit: the flag, the model's positions and the KV pool, whichever is least."""
        limit = self.engine.info.max_context_tokens
        return min(limit, self.config.max_context_tokens) if self.config.max_context_tokens else limit

    def salt(self, owner: str | None) -> str | None:
        """The prefix-cache partition of ``owner`` (``None``: shared)."""
        if owner is None or not self.config.isolated:
            return None
        return hashlib.sha256(owner.encode()).hexdigest()[:16]

    def check_model(self, name: str) -> None:
        """404 ``model_not_found`` unless ``name`` is served here."""
        if name not in self.config.names:
            raise APIError(
                404, "model_not_found", f"the model {name!r} does not exist; served: {list(self.config.names)}", "model"
            )

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, generation: bool
    ) -> RenderedConversation:
        """Render with the model's template; template failures and non-text content parts are the client's (400)."""
        check_content(messages)
        plain = [m.model_dump(exclude_none=True) for m in messages]
        try:
            return self.chat.render(plain, tools=tools, add_generation_prompt=generation)
        except RenderError as exc:
            raise APIError(400, "invalid_messages", str(exc), "messages") from exc

    def check_directives(self, directives: list[Directive], param: str) -> None:
        """Enforce the per-request directive limits."""
        if len(directives) > self.config.max_directives:
            raise APIError(400, "too_many_directives", f"at most {self.config.max_directives} directives", param)
        for i, d in enumerate(directives):
            if len(d.replacement) > self.config.max_replacement_tokens:
                raise APIError(
                    400,
                    "replacement_too_long",
                    f"directive {i}: replacement longer than {self.config.max_replacement_tokens} tokens",
                    f"{param}.{i}.replacement",
                )

    def check_tokens(self, tokens: list[int], param: str) -> None:
        """Token ids must exist in the vocabulary, and fit the context."""
        vocab = self.engine.info.vocab_size
        bad = [t for t in tokens if t < 0 or t >= vocab]
        if bad:
            raise APIError(400, "token_invalid", f"token {bad[0]} is outside the vocabulary", param)
        if len(tokens) > self.context_tokens:
            raise APIError(400, "context_length_exceeded", f"more than {self.context_tokens} tokens", param)

    def _record(self, report: SpliceReport | None) -> None:
        if report is None:
            return
        fb = report.fallback
        self.metrics.splices.labels("fallback" if fb else "applied", fb.code.value if fb else "").inc()
        self.metrics.splice_ms.observe(report.splice_ms)

    def _splice_error(self, exc: SpliceError, param: str) -> APIError:
        self.metrics.splices.labels("error", exc.code.value).inc()
        return APIError(strict_status(exc.code), exc.code.value, exc.message, param)

    # -- chat ---------------------------------------------------------------------------------------
    def shed(self, tokens: int, keep: Session | None = None) -> bool:
        """Drop least recently used idle sessions holding at least ``tokens`` cached tokens.

        The KV pool is full of pinned sessions: they are cache handles, so the oldest make room
        (a later request on one falls back to ``base_mismatch``). ``False`` if none could go.
        """
        freed, dropped = 0, False
        for session in self.sessions.all():
            if freed >= tokens:
                break
            if session is keep or session.users or session.handle is None:
                continue
            freed += session.handle.cached
            self.sessions.drop(session)
            dropped = True
        return dropped

    async def _start_with_room(
        self,
        session: Session | None,
        prompt: list[int],
        scope: CacheScope,
        request: SpliceRequest | None,
        handle: Handle | None,
    ) -> ChatTurn:
        """Start the turn; when the pool is full, shed idle sessions and serve it as a forget."""
        fallback = None
        for _ in range(3):
            try:
                chat = await self._start(session, prompt, scope, request, handle)
            except CapacityError as exc:
                handle, request = None, None  # the engine released the session's handle
                fallback = FallbackInfo(code="capacity", message=f"KV pool full, idle sessions dropped: {exc}")
                if not self.shed(len(prompt), keep=session):
                    raise APIError(503, "capacity", str(exc)) from exc
                continue
            chat.fallback = chat.fallback or fallback
            return chat
        raise APIError(503, "capacity", "the KV pool stayed full after dropping idle sessions")

    @asynccontextmanager
    async def chat_turn(
        self, ext: LeylineRequest | None, owner: str | None, prompt: list[int], transcript: Transcript | None = None
    ) -> AsyncIterator[ChatTurn]:
        """Resolve the session, splice if asked, prefill; yield the turn; keep or release its handle.

        Hold the context for as long as the turn decodes (a stream keeps it until it is closed).
        ``transcript`` (the request's messages and rendering) lets auto-splice tell the client's
        edits from the template's.
        """
        if ext is not None:
            self.check_directives(ext.directives, "leyline.directives")
        session, fallback = resolve_session(self, ext, owner, prompt)
        if session is None:
            chat = await self._start_with_room(None, prompt, CacheScope(self.salt(owner)), None, None)
            try:
                yield chat
            finally:
                self.engine.release(chat.turn.handle)
            return
        async with self.sessions.use(session):
            request, base_fallback, auto = (None, None, False)
            if ext is None:
                session.incoming = transcript
            if session.handle is not None:
                request, base_fallback, auto = splice_request(self, ext, session, prompt)
            elif ext is not None and ext.directives and fallback is None:
                message = "a new session has no base to apply directives to"
                if ext.strict:
                    raise APIError(409, "base_mismatch", message, "leyline.directives")
                base_fallback = FallbackInfo(code="base_mismatch", message=message)
            handle, session.handle = session.handle, None
            try:
                chat = await self._start_with_room(session, prompt, session.scope, request, handle)
            except SpliceError as exc:
                session.handle = handle  # strict: nothing changed
                raise self._splice_error(exc, "leyline.directives") from exc
            except BaseException:
                self.sessions.drop(session)  # its handle was released by the engine
                raise
            chat.fallback = fallback or base_fallback or chat.fallback
            chat.auto_splice = auto
            session.handle = chat.turn.handle
            if session.incoming is not None:  # a new session: this request is the next one's transcript
                session.transcript, session.incoming = session.incoming, None
            try:
                yield chat
            finally:
                session.handle = chat.turn.handle

    async def _start(
        self,
        session: Session | None,
        prompt: list[int],
        scope: CacheScope,
        request: SpliceRequest | None,
        handle: Handle | None = None,
    ) -> ChatTurn:
        turn = await self.engine.start_turn(prompt, scope, handle, request)
        self._record(turn.report)
        reused, rotated, prefilled = turn.counts()
        self.metrics.record_tokens(reused, rotated, prefilled, turn.approximate_tokens)
        fb = turn.report.fallback if turn.report else None
        info = FallbackInfo(code=fb.code.value, message=fb.message) if fb else None
        return ChatTurn(turn, session, info)

    def result(self, chat: ChatTurn) -> LeylineResult:
        """The ``leyline`` field of a chat completion response."""
        turn = chat.turn
        reused, rotated, prefilled = turn.counts()
        tokens = turn.prompt + turn.generated
        report = turn.report
        sources = list(chat.session.auto_sources) if chat.auto_splice and chat.session else []
        return LeylineResult(
            session_id=chat.session.id if chat.session else None,
            base=BaseRef(length=len(tokens), digest=digest(tokens)),
            applied=chat.fallback is None,
            fallback=chat.fallback,
            auto_splice=chat.auto_splice,
            reused_tokens=reused,
            rotated_tokens=rotated,
            prefilled_tokens=prefilled,
            approximate_tokens=turn.approximate_tokens,
            canary=report.canary if report else "skipped",
            completion_token_ids=list(turn.generated),
            splice_ms=report.splice_ms if report else 0.0,
            sources=sources,
            template_directives=sources.count("template"),
        )

    # -- sessions -----------------------------------------------------------------------------------
    async def open_session(self, owner: str | None, tokens: list[int]) -> Session:
        """Prefill ``tokens`` and open a session on them."""
        if not tokens:
            raise APIError(400, "empty_session", "a session needs at least one token", "tokens")
        self.check_tokens(tokens, "tokens")
        session = self.sessions.open(owner, self.salt(owner))
        async with self.sessions.use(session):
            for attempt in range(2):
                try:
                    session.handle = await self.engine.open(tokens, session.scope)
                    break
                except CapacityError as exc:
                    if attempt or not self.shed(len(tokens), keep=session):
                        self.sessions.drop(session)
                        raise APIError(503, "capacity", str(exc)) from exc
        return session

    def get_session(self, session_id: str, owner: str | None) -> Session:
        """The caller's session or 404 (also for another key's session)."""
        session = self.sessions.get(session_id, owner)
        if session is None:
            raise APIError(404, "session_not_found", f"unknown or expired session {session_id!r}", "session_id")
        return session

    async def splice_session(
        self, session_id: str, owner: str | None, directives: list[Directive], base: BaseRef | None, strict: bool
    ) -> tuple[Session, SpliceReport]:
        """Splice a session without generating."""
        self.check_directives(directives, "directives")
        session = self.get_session(session_id, owner)
        async with self.sessions.use(session):
            handle, session.handle = session.handle, None
            if handle is None:
                raise APIError(404, "session_not_found", f"session {session_id!r} holds no cache", "session_id")
            blocks = self.blocks.resolve((d.block for d in directives), owner)
            ref = (base.length, base.digest) if base else (None, None)
            request = SpliceRequest(directives, ref[0], ref[1], strict, blocks=blocks)
            try:
                session.handle, report = await self.engine.splice(handle, request)
            except SpliceError as exc:
                session.handle = handle
                raise self._splice_error(exc, "directives") from exc
            except CapacityError as exc:
                self.sessions.drop(session)
                raise APIError(503, "capacity", str(exc)) from exc
        self._record(report)
        self.metrics.record_tokens(report.reused_tokens, report.rotated_tokens, report.prefilled_tokens, 0)
        return session, report

    async def open_block(self, owner: str | None, tokens: list[int]) -> Block:
        """Prefill ``tokens`` alone at positions ``[0, n)`` and keep them as a block."""
        if not tokens:
            raise APIError(400, "empty_block", "a block needs at least one token", "tokens")
        self.check_tokens(tokens, "tokens")
        block_id = self.blocks.new_id()
        scope = CacheScope(self.salt(owner), f"block:{block_id}")
        for attempt in range(2):
            try:
                return self.blocks.add(block_id, owner, await self.engine.open(tokens, scope))
            except CapacityError as exc:
                if attempt or not self.shed(len(tokens)):
                    raise APIError(503, "capacity", f"no room for the block: {exc}") from exc
        raise AssertionError("unreachable")

    def get_block(self, block_id: str, owner: str | None) -> Block:
        """The caller's block or 404 (also for another key's block)."""
        block = self.blocks.get(block_id, owner)
        if block is None:
            raise APIError(404, "block_not_found", f"unknown block {block_id!r}", "block_id")
        return block

    async def shutdown(self) -> None:
        """Release every session and block and stop the engine."""
        for session in self.sessions.all():
            self.sessions.drop(session)
        for block in self.blocks.all():
            self.blocks.drop(block)
        await self.engine.close()
