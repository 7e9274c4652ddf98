"""The server's behaviour behind the routes: sessions, splices, generation, limits.

Threading: the event loop owns the session store and the per-session locks; every touch of the
engine (radix tree, pool, model) happens on the engine thread through :class:`AsyncEngine`. A
request's splice + prefill is one engine job; decoding is one job per token, so requests from
many sessions interleave.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch

from leyline_sdk.directives import Directive, digest
from leyline_sdk.errors import RenderError
from leyline_sdk.rendering import HFChatTokenizer, RenderedConversation
from leyline_sdk.spans import common_prefix_length, diff_token_sequences
from leyline_server.api.errors import APIError
from leyline_server.api.metrics import Metrics
from leyline_server.api.schemas import BaseRef, ChatCompletionRequest, Message
from leyline_server.engines.embedded.engine import CapacityError, Engine, GenerationStep, Pinned, SamplingParams
from leyline_server.engines.embedded.worker import AsyncEngine
from leyline_server.sessions import Session, SessionStore
from leyline_server.splice import Fallback, FallbackCode, SpliceError, SpliceReport, splice

__all__ = ["ServerConfig", "LeylineService", "Prepared"]


@dataclass(frozen=True)
class ServerConfig:
    """Server settings and limits."""

    model_name: str
    api_keys: frozenset[str] = frozenset()
    auto_splice: bool = False
    max_body_bytes: int = 8 * 2**20
    max_directives: int = 256
    max_replacement_tokens: int = 16_384
    max_context_tokens: int = 32_768
    max_sessions_per_key: int = 256
    max_sessions: int = 4096
    session_ttl_s: float = 3600.0
    default_max_tokens: int = 256


@dataclass
class Prepared:
    """A prompt cached and ready to decode, with what it took."""

    pinned: Pinned
    logits: torch.Tensor
    prompt: list[int]
    session: Session | None
    report: SpliceReport | None
    final_reused: int
    auto_splice: bool = False
    fallback: Fallback | None = None
    generated: list[int] = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        """(reused, rotated, prefilled) prompt tokens."""
        if self.report is None:
            return self.final_reused, 0, len(self.prompt) - self.final_reused
        # the prompt's tail past the spliced sequence (the final prefill always recomputes the
        # last token for its logits; that duplicate is not a prompt token computed anew)
        spliced = self.report.reused_tokens + self.report.rotated_tokens + self.report.prefilled_tokens
        extra = max(len(self.prompt) - max(self.final_reused, spliced), 0)
        return self.report.reused_tokens, self.report.rotated_tokens, self.report.prefilled_tokens + extra


def _strict_status(code: FallbackCode) -> int:
    if code is FallbackCode.BASE_MISMATCH:
        return 409
    if code is FallbackCode.CAPACITY:
        return 503
    return 422


class LeylineService:
    """Everything the HTTP routes do, minus HTTP."""

    def __init__(self, engine: Engine, tokenizer: Any, config: ServerConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat = HFChatTokenizer(tokenizer)
        self.config = config
        self.front = AsyncEngine(engine)
        self.metrics = Metrics()
        self.sessions = SessionStore(
            on_release=lambda pinned: self.front.submit(engine.unpin, pinned),
            ttl_s=config.session_ttl_s,
            max_sessions=config.max_sessions,
        )
        self._locks: dict[str, asyncio.Lock] = {}

    # -- helpers ----------------------------------------------------------------------------------
    def lock(self, session_id: str) -> asyncio.Lock:
        """The lock that serialises requests on one session."""
        return self._locks.setdefault(session_id, asyncio.Lock())

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, generation: bool
    ) -> RenderedConversation:
        """Render with the model's template; template failures are the client's (400)."""
        plain = [m.model_dump(exclude_none=True) for m in messages]
        try:
            return self.chat.render(plain, tools=tools, add_generation_prompt=generation)
        except RenderError as exc:
            raise APIError(400, "invalid_messages", str(exc), "messages") from exc

    def check_directives(self, directives: list[Directive]) -> None:
        """Enforce the per-request directive limits."""
        if len(directives) > self.config.max_directives:
            raise APIError(400, "too_many_directives", f"at most {self.config.max_directives} directives", "directives")
        for i, d in enumerate(directives):
            if len(d.replacement) > self.config.max_replacement_tokens:
                raise APIError(
                    400,
                    "replacement_too_long",
                    f"directive {i}: replacement longer than {self.config.max_replacement_tokens} tokens",
                    f"directives.{i}.replacement",
                )

    def check_tokens(self, tokens: list[int], param: str) -> None:
        """Token ids must exist in the vocabulary."""
        bad = [t for t in tokens if t < 0 or t >= self.engine.vocab_size]
        if bad:
            raise APIError(400, "token_invalid", f"token {bad[0]} is outside the vocabulary", param)

    def new_session(self, owner: str | None, pinned: Pinned) -> Session:
        """Store a session, enforcing the per-key cap (429)."""
        if self.sessions.count(owner) >= self.config.max_sessions_per_key:
            self.front.submit(self.engine.unpin, pinned)
            raise APIError(429, "too_many_sessions", f"at most {self.config.max_sessions_per_key} sessions per key")
        return self.sessions.create(owner, pinned)

    def _find_by_prefix(self, owner: str | None, prompt: list[int]) -> Session | None:
        best, best_len = None, 0
        for session in self.sessions.all():
            if session.owner != owner:
                continue
            n = common_prefix_length(session.tokens, prompt)
            if n > best_len:
                best, best_len = session, n
        return self.sessions.get(best.id, owner) if best else None

    # -- chat -------------------------------------------------------------------------------------
    def sampling(self, req: ChatCompletionRequest) -> SamplingParams:
        """Decoding parameters from the request."""
        max_tokens = req.max_completion_tokens or req.max_tokens or self.config.default_max_tokens
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed)

    async def prepare_chat(self, req: ChatCompletionRequest, owner: str | None) -> Prepared:
        """Resolve the session, splice if asked (or auto-splice), prefill the prompt."""
        rendered = self.render(req.messages, req.tools, generation=True)
        prompt = rendered.tokens
        max_tokens = self.sampling(req).max_tokens
        if len(prompt) + max_tokens > self.config.max_context_tokens:
            raise APIError(
                400,
                "context_length_exceeded",
                f"{len(prompt)} prompt tokens + {max_tokens} max tokens exceed {self.config.max_context_tokens}",
                "messages",
            )
        ext = req.leyline
        directives = ext.directives if ext else []
        self.check_directives(directives)
        session: Session | None = None
        pre_fallback: Fallback | None = None
        if ext is not None and ext.session_id:
            session = self.sessions.get(ext.session_id, owner)
            if session is None:
                if ext.strict:
                    raise APIError(404, "session_not_found", "unknown or expired session", "leyline.session_id")
                if directives:
                    pre_fallback = Fallback(code=FallbackCode.BASE_MISMATCH, message="unknown or expired session")
        elif ext is None and self.config.auto_splice:
            session = self._find_by_prefix(owner, prompt)
        auto = ext is None and self.config.auto_splice and session is not None
        base: BaseRef | None = ext.base if ext else None
        strict = bool(ext and ext.strict)

        def job() -> Prepared:
            pinned = session.pinned if session else None
            todo = directives if (pinned is not None and pre_fallback is None) else []
            if auto and pinned is not None and prompt[: len(pinned.tokens)] != pinned.tokens:
                todo = diff_token_sequences(pinned.tokens, prompt)
            report = None
            if pinned is not None and todo:
                pinned, report = splice(
                    self.engine,
                    pinned,
                    todo,
                    base_length=base.length if base else None,
                    base_digest=base.digest if base else None,
                    prompt=prompt,
                    strict=strict,
                )
            fresh, logits, reused = self.engine.prefill(prompt, previous=pinned)
            return Prepared(fresh, logits, prompt, session, report, reused, auto and bool(todo), pre_fallback)

        try:
            prepared = await self.front.call(job)
        except SpliceError as exc:
            self.metrics.splices.labels("error", exc.code.value).inc()
            raise APIError(_strict_status(exc.code), exc.code.value, exc.message, "leyline.directives") from exc
        except CapacityError as exc:
            raise APIError(503, "capacity", str(exc)) from exc
        if prepared.report is not None:
            fb = prepared.report.fallback
            self.metrics.splices.labels("fallback" if fb else "applied", fb.code.value if fb else "").inc()
            self.metrics.splice_ms.observe(prepared.report.splice_ms)
            prepared.fallback = prepared.fallback or fb
        if prepared.session is not None:
            self.sessions.update(prepared.session, prepared.pinned)
        elif ext is not None or self.config.auto_splice:
            prepared.session = self.new_session(owner, prepared.pinned)
        self.metrics.record_tokens(*prepared.counts())
        return prepared

    async def generate(self, prepared: Prepared, params: SamplingParams) -> AsyncIterator[GenerationStep]:
        """Decode; the session (if any) ends with base = prompt + generated tokens."""
        try:
            async for step in self.front.stream(prepared.pinned, prepared.logits, params):
                prepared.generated.append(step.token)
                yield step
        finally:
            if prepared.session is None:
                self.front.submit(self.engine.unpin, prepared.pinned)

    def leyline_stats(self, prepared: Prepared) -> dict[str, Any]:
        """The ``leyline`` field of a chat completion response."""
        reused, rotated, prefilled = prepared.counts()
        tokens = prepared.prompt + prepared.generated
        fb = prepared.fallback
        return {
            "session_id": prepared.session.id if prepared.session else None,
            "base": {"length": len(tokens), "digest": digest(tokens)},
            "applied": fb is None,
            "fallback": fb.model_dump(mode="json") if fb else None,
            "auto_splice": prepared.auto_splice,
            "reused_tokens": reused,
            "rotated_tokens": rotated,
            "prefilled_tokens": prefilled,
            "completion_token_ids": list(prepared.generated),
            "splice_ms": prepared.report.splice_ms if prepared.report else 0.0,
        }

    # -- sessions -----------------------------------------------------------------------------------
    async def create_session(self, owner: str | None, tokens: list[int]) -> Session:
        """Prefill ``tokens`` and open a session on them."""
        if not tokens:
            raise APIError(400, "empty_session", "a session needs at least one token", "tokens")
        if len(tokens) > self.config.max_context_tokens:
            raise APIError(
                400, "context_length_exceeded", f"more than {self.config.max_context_tokens} tokens", "tokens"
            )
        self.check_tokens(tokens, "tokens")
        try:
            pinned, _, _ = await self.front.call(self.engine.prefill, tokens)
        except CapacityError as exc:
            raise APIError(503, "capacity", str(exc)) from exc
        return self.new_session(owner, pinned)

    def get_session(self, session_id: str, owner: str | None) -> Session:
        """The caller's session or 404 (also for another key's session)."""
        session = self.sessions.get(session_id, owner)
        if session is None:
            raise APIError(404, "session_not_found", "unknown or expired session", "session_id")
        return session

    async def apply_directives(
        self, session: Session, directives: list[Directive], base: BaseRef | None, strict: bool
    ) -> SpliceReport:
        """Splice a session without generating."""
        self.check_directives(directives)

        def job() -> tuple[Pinned, SpliceReport]:
            return splice(
                self.engine,
                session.pinned,
                directives,
                base_length=base.length if base else None,
                base_digest=base.digest if base else None,
                strict=strict,
            )

        try:
            pinned, report = await self.front.call(job)
        except SpliceError as exc:
            self.metrics.splices.labels("error", exc.code.value).inc()
            raise APIError(_strict_status(exc.code), exc.code.value, exc.message, "directives") from exc
        except CapacityError as exc:
            raise APIError(503, "capacity", str(exc)) from exc
        self.sessions.update(session, pinned)
        fb = report.fallback
        self.metrics.splices.labels("fallback" if fb else "applied", fb.code.value if fb else "").inc()
        self.metrics.splice_ms.observe(report.splice_ms)
        self.metrics.record_tokens(report.reused_tokens, report.rotated_tokens, report.prefilled_tokens)
        return report

    def shutdown(self) -> None:
        """Release every session and stop the engine thread."""
        for session in self.sessions.all():
            self.sessions.delete(session.id, session.owner)
        self.front.shutdown()
