"""The engine contract: what the splice executor, the sessions and the HTTP service need from an engine.

Two faces, one contract:

* :class:`SpliceBackend` — synchronous primitives that run *where the KV lives* (the embedded
  engine's worker thread, SGLang's scheduler process, llama.cpp's worker thread). The splice
  executor (:mod:`leyline_server.splice.execute`) walks a :class:`~leyline_server.splice.plan.SplicePlan`
  against them. The engine owns its pool layout: the executor never sees a tensor or a slot.
* :class:`Engine` — the asynchronous face the service uses: open a session, run a turn (splice
  if asked, prefill, decode), splice without generating, release a handle, model info.

Rules every engine keeps (tests check them on the embedded engine):

* A :class:`Handle` is *locked*: its cached tokens cannot be evicted until ``release``. Every
  handle handed out is released exactly once (``commit`` and ``prefill(previous=...)`` release
  the previous handle themselves).
* KV is *exact* when it equals what a fresh prefill would compute, *approximate* once a rotated
  row (or anything computed after one) is involved. ``Handle.exact`` counts the exact leading
  tokens. Approximate KV is cached under the handle's :class:`CacheScope` ``private`` tag and
  matched only by requests carrying the same tag; exact KV is matched by everyone with the same
  ``salt`` (the per-key isolation of the prefix cache).
* Capacity problems raise :class:`CapacityError`, never anything else; the executor turns them
  into the ``capacity`` fallback.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from leyline_sdk.directives import Directive, KeptRun
    from leyline_server.splice.report import SpliceReport

__all__ = [
    "CacheScope",
    "SHARED",
    "CanaryResult",
    "CapacityError",
    "Engine",
    "GenerationStep",
    "Handle",
    "ModelInfo",
    "Prefilled",
    "SamplingParams",
    "SpliceBackend",
    "SpliceRequest",
    "TokenLogprob",
    "Turn",
]


class CapacityError(RuntimeError):
    """The KV cache cannot hold the tokens, even after evicting everything unlocked."""


class CacheScope(NamedTuple):
    """Who may match what: ``salt`` partitions exact KV (per API key when isolated), ``private``
    tags approximate KV (the session that asked for a splice)."""

    salt: str | None = None
    private: str | None = None


SHARED = CacheScope()  # the default scope: shared exact KV, no private tag


@dataclass(frozen=True)
class ModelInfo:
    """What the service needs to know about the served model."""

    name: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_context_tokens: int
    kv_capacity_tokens: int
    shiftable: bool
    unshiftable_reason: str | None = None
    engine: str = "embedded"
    parks_idle: bool = False  # idle pinned sequences leave the pool when it runs short (llama.cpp's parking)


@dataclass
class Handle:
    """A token sequence whose first ``cached`` tokens hold KV in the engine (locked until released).

    ``exact`` leading tokens hold exact KV; ``[exact, cached)`` is approximate and cached under
    ``scope.private``. Engines subclass it to carry their own references (slots, a node, a
    sequence id); nothing outside an engine reads those.
    """

    tokens: list[int]
    cached: int
    exact: int
    scope: CacheScope


class SamplingParams(BaseModel):
    """Decoding parameters (OpenAI semantics: temperature 0 is greedy)."""

    max_tokens: int = Field(default=16, ge=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[int, float] = Field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)


class TokenLogprob(NamedTuple):
    """A token and its log-probability under the model (before temperature and penalties)."""

    token: int
    logprob: float


@dataclass
class GenerationStep:
    """One decoded token (``finish_reason`` set on the last step)."""

    token: int
    finish_reason: str | None = None
    logprob: float | None = None
    top_logprobs: list[TokenLogprob] = field(default_factory=list)


class Prefilled(NamedTuple):
    """A prefill's result: the pinned sequence, reused tokens (of which approximate), engine state."""

    handle: Handle
    reused: int
    approximate: int
    state: Any = None


class CanaryResult(NamedTuple):
    """The layer-0 canary: ``ran`` False means the engine cannot read its keys back."""

    ran: bool
    error: float = 0.0
    tolerance: float = 0.0


class SpliceBackend(Protocol):
    """Synchronous splice primitives, run where the KV lives (see the module docstring).

    A *stage* is a new sequence under construction: ``begin`` keeps a handle's first ``keep``
    tokens, ``move`` copy-rotates kept runs of the handle to their new positions (fresh storage:
    the old path may still serve others), ``fill`` computes tokens at new positions attending to
    everything staged before them, ``commit`` caches the stage as a locked handle (releasing
    ``previous``), ``abort`` gives its storage back.
    """

    @property
    def info(self) -> ModelInfo: ...

    @property
    def rotation_budget(self) -> int: ...

    def prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled: ...
    def release(self, handle: Handle) -> None: ...
    def rotation_counts(self, handle: Handle, positions: Sequence[int]) -> list[int] | None: ...
    def begin(self, handle: Handle, keep: int) -> Any: ...
    def move(self, stage: Any, handle: Handle, runs: Sequence[KeptRun]) -> None: ...
    def fill(self, stage: Any, at: int, tokens: Sequence[int]) -> None: ...
    def canary(self, stage: Any, positions: Sequence[int], tokens: Sequence[int]) -> CanaryResult: ...
    def commit(self, stage: Any, tokens: Sequence[int], exact: int, previous: Handle) -> Handle: ...
    def abort(self, stage: Any) -> None: ...


@dataclass(frozen=True)
class SpliceRequest:
    """Directives for a session, with the client's view of its base and the strictness.

    ``blocks`` holds the precompiled blocks the directives may name (already resolved for the
    caller's key: a name missing here is an unknown block).
    """

    directives: Sequence[Directive]
    base_length: int | None = None
    base_digest: str | None = None
    strict: bool = False
    prompt: Sequence[int] | None = None
    blocks: Mapping[str, Handle] = field(default_factory=dict)


@dataclass
class Turn:
    """One request's prompt, cached and ready to decode, with what it took.

    ``report`` is the splice's (``None`` if none ran); ``reused`` and ``approximate`` count the
    prompt tokens the final prefill found cached (``approximate`` of them rotated or downstream
    of a rotation). ``handle`` ends as prompt + generated tokens once the stream is done.
    """

    handle: Handle
    prompt: list[int]
    report: SpliceReport | None
    reused: int
    approximate: int
    state: Any = None
    generated: list[int] = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        """(reused, rotated, prefilled) prompt tokens: the splice's plus the final prefill's."""
        if self.report is None:
            return self.reused, 0, len(self.prompt) - self.reused
        spliced = self.report.reused_tokens + self.report.rotated_tokens + self.report.prefilled_tokens
        # the prompt's tail past the spliced sequence (the final prefill always recomputes the
        # last token for its logits; that duplicate is not a prompt token computed anew)
        extra = max(len(self.prompt) - max(self.reused, spliced), 0)
        return self.report.reused_tokens, self.report.rotated_tokens, self.report.prefilled_tokens + extra

    @property
    def approximate_tokens(self) -> int:
        """Prompt tokens served with approximate KV (rotated, or computed after rotated KV)."""
        return max(0, min(len(self.prompt), self.handle.cached) - self.handle.exact)


class Engine(Protocol):
    """The service-facing engine: asynchronous, engine-agnostic (see the module docstring)."""

    @property
    def info(self) -> ModelInfo: ...

    async def open(self, tokens: Sequence[int], scope: CacheScope) -> Handle:
        """Prefill ``tokens`` and return them pinned (a new session's base)."""
        ...

    async def start_turn(
        self, prompt: Sequence[int], scope: CacheScope, session: Handle | None, splice: SpliceRequest | None
    ) -> Turn:
        """Splice ``session`` if asked (falling back as the report says), then prefill ``prompt``.

        ``session`` is consumed unless ``SpliceError`` (strict) is raised; after any other error
        (``CapacityError``) it has been released.
        """
        ...

    def stream(self, turn: Turn, params: SamplingParams) -> AsyncGenerator[GenerationStep, None]:
        """Decode after ``turn``; closing early keeps what was generated. Ends with ``turn.handle``
        holding prompt + generated tokens."""
        ...

    async def splice(self, handle: Handle, request: SpliceRequest) -> tuple[Handle, SpliceReport]:
        """Apply directives to ``handle`` without generating (``handle`` is consumed)."""
        ...

    def release(self, handle: Handle) -> None:
        """Unpin ``handle`` (its KV becomes evictable); never blocks, safe from any thread."""
        ...

    async def close(self) -> None:
        """Release everything and stop the engine's workers."""
        ...
