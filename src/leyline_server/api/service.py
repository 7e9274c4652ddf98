"""The server's state and the primitives of a turn: sessions, blocks, room, the engine. No HTTP here.

The order a chat turn runs these in lives in :mod:`.pipeline`; this module holds what the steps
act on and the steps that touch the engine (:meth:`LeylineService.start_plain`,
:meth:`LeylineService.session_turn`), plus the sessions and blocks routes' operations.

Threading: the event loop owns the session store and admission; chat templates render on the
render threads (:mod:`.render`); every touch of the KV cache happens inside the engine
(:class:`~leyline_server.contract.base.Engine`), which runs its own jobs. A request on a session
holds that session (:meth:`SessionStore.use`) from the splice to the end of decoding.

Every request's work is bounded before the engine allocates KV: the routes hold an admission
ticket (:mod:`.admission`); prompts, token lists and directive results are checked against the
context (a directive whose result would not fit is named), and the KV a request may hold is
reserved on the ticket first (:mod:`.room`, which sheds idle sessions to keep it there and retries
every kind of allocation alike when the pool is full).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from leyline_sdk.core.directives import Mode
from leyline_sdk.core.fallbacks import FallbackCode
from leyline_sdk.core.wire import FallbackInfo, LeylineRequest
from leyline_server.api.admission import Admission, Ticket
from leyline_server.api.compiles import CompileGate
from leyline_server.api.config import ServerConfig
from leyline_server.api.conversations import Conversations, Prompt, RecognisedTurn
from leyline_server.api.errors import APIError
from leyline_server.api.limits import overflow
from leyline_server.api.metrics import Metrics
from leyline_server.api.render import PromptShape, RenderService
from leyline_server.api.room import Room
from leyline_server.api.session_choice import directives_request
from leyline_server.api.session_ops import SessionOps
from leyline_server.blocks import BlockStore
from leyline_server.contract.base import Engine
from leyline_server.contract.report import Refused
from leyline_server.contract.values import (
    CacheScope,
    CapacityError,
    Handle,
    PrefillProgress,
    SpliceRequest,
    Turn,
    kept_on_cancel,
)
from leyline_server.sessions import Session, SessionStore
from leyline_server.splice import SpliceError, validate

__all__ = ["ServerConfig", "LeylineService", "ChatTurn", "SessionPlan", "Prompt"]

T = TypeVar("T")


@dataclass
class SessionPlan:
    """A session turn checked and reserved (:meth:`LeylineService.plan_turn`), not computed yet."""

    session: Session
    prompt: Prompt
    request: SpliceRequest | None  # the splice to ask the engine for (None: the prompt extends the base, or a forget)
    fallback: FallbackInfo | None


@dataclass
class ChatTurn:
    """A chat request in flight: the engine's turn, its session, and what to report."""

    turn: Turn
    session: Session | None
    fallback: FallbackInfo | None = None
    auto: RecognisedTurn | None = None
    auto_splice: bool = False
    timings: dict[str, float] = field(default_factory=dict)  # where the time to the first token went (ms)


class LeylineService(SessionOps):
    """Everything the HTTP routes do, minus HTTP (the sessions and blocks routes' part in
    :class:`~leyline_server.api.session_ops.SessionOps`)."""

    def __init__(self, engine: Engine, tokenizer: Any, config: ServerConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = Metrics()
        self.render = RenderService(tokenizer, config, self.context_tokens)
        self.chat = self.render.chat
        capacity = engine.info.kv_capacity_tokens
        self.blocks = BlockStore(engine.release, config.max_blocks_per_key, max_tokens_per_key=max(capacity // 4, 1))
        self.sessions = SessionStore(
            release=engine.release,
            ttl_s=config.session_ttl_s,
            max_sessions=config.max_sessions,
            max_per_key=config.max_sessions_per_key,
        )
        self.conversations = Conversations(self.sessions, self.render)
        self.admission = Admission(
            capacity,
            config.max_concurrent_per_key,
            config.key_share,
            config.admission_timeout_s,
        )
        self.room = Room(engine, self.sessions, self.blocks, self.admission)
        self.compiles = CompileGate(engine.check_constraint, engine.constraint_ready, config.compile_timeout_s)

    # -- checks -----------------------------------------------------------------------------------
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

    # -- chat ---------------------------------------------------------------------------------------
    async def prompt(
        self,
        owner: str | None,
        messages: Sequence[Any],
        tools: list[Any] | None,
        ext: LeylineRequest | None,
        shape: PromptShape | None = None,
        hints: Mapping[str, str] | None = None,
        client_mode: Mode | None = None,
        recognise: bool = False,
    ) -> Prompt:
        """The request's prompt tokens (rendered off the event loop, bounded; see :mod:`.render`),
        and the conversation it continues for a plain client under ``--auto-splice`` or the
        client-edits opt-in (``client_mode``: the mode of the client's own edits), or when the
        protocol asks (``recognise``: continued exactly, nothing spliced; see :mod:`.conversations`).

        A request that sets template variables or continues its final message (``shape``) is
        served without a conversation: its rendering is not the conversation's plain one.
        """
        spliced = self.config.auto_splice or client_mode is not None
        if ext is None and shape is None and (spliced or recognise):
            mode = client_mode if client_mode is not None else Mode.FORGET
            exact = client_mode is Mode.FORGET  # the client asked for exact KV (X-Leyline-Client-Edits: exact)
            turn = await self.conversations.prepare(owner, messages, tools, hints, mode, splice=spliced, exact=exact)
            if turn is not None:
                return Prompt(turn.tokens, turn)
        return Prompt(await self.render.tokens(owner, messages, tools, True, shape))

    async def start_plain(
        self, prompt: list[int], owner: str | None, progress: PrefillProgress | None = None
    ) -> ChatTurn:
        """Prefill a turn without a session (the prefix cache alone); release its handle when done."""
        return await self._start_with_room(None, prompt, CacheScope(self.salt(owner)), None, None, owner, progress)

    async def plan_turn(
        self,
        ext: LeylineRequest | None,
        session: Session,
        prompt: Prompt,
        ticket: Ticket,
        fallback: FallbackInfo | None,
        named: Mapping[str, Handle],
    ) -> SessionPlan:
        """What :meth:`session_turn` will ask of the held ``session``, checked before anything is
        computed: a directive whose result would not fit is a 400, a strict splice that cannot
        apply its 4xx; the old base's KV is reserved when the prompt does not extend it."""
        tokens = prompt.tokens
        request, base_fallback = await self._turn_splice(ext, session, prompt, named, fallback)
        base = session.tokens
        too_long = overflow(len(base), ext.directives, request.blocks, self.context_tokens) if ext and request else None
        if too_long is not None:
            param = f"leyline.directives.{too_long[0]}"
            raise APIError(400, FallbackCode.CONTEXT_LENGTH.value, too_long[1], param)
        if request is not None and request.strict:
            try:
                validate(self.engine.info, base, request)
            except Refused as exc:
                raise self._splice_error(SpliceError(exc.code, exc.message), "leyline.directives") from exc
        if tokens[: len(base)] != base:  # the old base stays pinned until the new one is built
            await self.room.reserve(ticket, len(base))
        return SessionPlan(session, prompt, request, fallback or base_fallback)

    async def session_turn(
        self, plan: SessionPlan, owner: str | None, progress: PrefillProgress | None = None
    ) -> ChatTurn:
        """Splice the held session as :meth:`plan_turn` planned and prefill the prompt (one engine job).

        The session's old base stays pinned until the new one is built; a strict splice error is a
        4xx (the session unchanged); a cancelled prefill keeps the session on its base, spliced if
        the splice had finished (:func:`kept_on_cancel`); any other failure drops the session.
        """
        session, auto = plan.session, plan.prompt.auto
        handle, session.handle = session.handle, None
        try:
            chat = await self._start_with_room(session, plan.prompt.tokens, session.scope, plan.request, handle, owner,
                                               progress)  # fmt: skip
        except SpliceError as exc:
            session.handle = handle  # strict: nothing changed
            raise self._splice_error(exc, "leyline.directives") from exc
        except BaseException as exc:
            session.handle = kept = kept_on_cancel(exc)  # a cancelled prefill gives its base back
            if kept is None:
                self.sessions.drop(session)  # its handle was released by the engine
            elif kept is not handle and auto is not None:
                self.conversations.forget(session)  # spliced: no longer the conversation recognised
            raise
        session.handle = chat.turn.handle
        chat.fallback = plan.fallback or chat.fallback
        if auto is not None:
            chat.auto, chat.auto_splice = auto, plan.request is not None
            self.conversations.commit(session, auto, chat.turn.handle)
        return chat

    async def _turn_splice(
        self,
        ext: LeylineRequest | None,
        session: Session,
        prompt: Prompt,
        named: Mapping[str, Handle],
        fallback: FallbackInfo | None,
    ) -> tuple[SpliceRequest | None, FallbackInfo | None]:
        """The splice the turn asks the engine for, and a base fallback to report."""
        if ext is None:
            assert prompt.auto is not None
            recognised = prompt.auto
            if session.handle is None and recognised.reuse is not None:
                session.handle = await self._open_reused(session, recognised.reuse.base)
            return (await self.conversations.edits_request(session, recognised) if session.handle else None), None
        self.conversations.forget(session)  # a client's own splices: no longer a plain client's conversation
        if session.handle is not None:
            return directives_request(named, ext, session, prompt.tokens)
        if ext.directives and fallback is None:
            message = "a new session has no base to apply directives to"
            if ext.strict:
                raise APIError(409, FallbackCode.BASE_MISMATCH.value, message, "leyline.directives")
            return None, FallbackInfo(code=FallbackCode.BASE_MISMATCH.value, message=message)
        return None, None

    async def _start_with_room(
        self,
        session: Session | None,
        prompt: list[int],
        scope: CacheScope,
        request: SpliceRequest | None,
        handle: Handle | None,
        owner: str | None,
        progress: PrefillProgress | None = None,
    ) -> ChatTurn:
        """Start ``owner``'s turn; when the pool is full, shed idle cache and serve it as a forget."""

        async def attempt(first: bool) -> ChatTurn:
            if first:
                return await self._start(session, prompt, scope, request, handle, owner, progress)
            chat = await self._start(session, prompt, scope, None, None, owner, progress)  # the engine released it
            chat.fallback = chat.fallback or FallbackInfo(
                code=FallbackCode.CAPACITY.value, message="KV pool full: idle sessions dropped, served as a forget"
            )
            return chat

        return await self.room.retry(attempt, len(prompt), keep=session)

    async def _start(
        self,
        session: Session | None,
        prompt: list[int],
        scope: CacheScope,
        request: SpliceRequest | None,
        handle: Handle | None = None,
        owner: str | None = None,
        progress: PrefillProgress | None = None,
    ) -> ChatTurn:
        turn = await self.engine.start_turn(prompt, scope, handle, request, owner, progress)
        self._record(turn.report)
        reused, rotated, prefilled = turn.counts()
        self.metrics.record_tokens(reused, rotated, prefilled, turn.approximate_tokens)
        return ChatTurn(turn, session, turn.report.fallback if turn.report else None)

    async def _open_reused(self, session: Session, base: Sequence[int]) -> Handle | None:
        """A new session's base opened on another conversation's cached tokens (conversation rule 4);
        ``None`` when the pool has no room for it (the turn is then prefilled as usual)."""
        try:
            return await self.engine.open(base, session.scope, session.owner)
        except CapacityError:
            return None

    async def shutdown(self) -> None:
        """Release every session and block and stop the engine and the render threads."""
        for session in self.sessions.all():
            self.sessions.drop(session)
        for block in self.blocks.all():
            self.blocks.drop(block)
        await self.engine.close()
        self.render.close()
