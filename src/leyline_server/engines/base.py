"""The engine contract: what the splice executor, the sessions and the HTTP service need from an engine.

Two faces, one contract:

* :class:`SpliceBackend` — synchronous primitives the splice executor
  (:mod:`leyline_server.splice.execute`) walks a :class:`~leyline_server.splice.plan.SplicePlan`
  against: on the embedded and llama.cpp engines they run on the engine's own thread, next to
  the KV; on SGLang on a worker thread of the server process, each call a round trip to the
  schedulers. The engine owns its pool layout: the executor never sees a tensor, a slot or a
  sequence id. :class:`SyncCore` adds decoding, for the engines whose whole model runs on one
  thread (:class:`~leyline_server.engines.threaded.ThreadedEngine` puts one behind ``Engine``).
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

from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from leyline_sdk.core.directives import Directive, KeptRun
    from leyline_server.engines.logits import Processors
    from leyline_server.splice.report import SpliceReport

__all__ = [
    "CacheScope",
    "SHARED",
    "CanaryResult",
    "CapacityError",
    "Constraint",
    "ConstraintError",
    "Engine",
    "GenerationStep",
    "Handle",
    "ModelInfo",
    "Prefilled",
    "SamplingParams",
    "SpliceBackend",
    "SpliceRequest",
    "StageT",
    "SyncCore",
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


class ConstraintError(ValueError):
    """A :class:`Constraint` the engine's grammar backend cannot compile (the message says why)."""


class Constraint(BaseModel):
    """What the output must match, in the terms of xgrammar (SGLang's default grammar backend).

    ``kind`` and ``value``:

    * ``json_schema``: a JSON schema, as JSON text (OpenAI's ``json_object`` is ``{"type": "object"}``);
    * ``regex``: a regular expression the whole output matches;
    * ``ebnf``: an EBNF grammar with a ``root`` rule (xgrammar's dialect, as SGLang's ``ebnf``);
    * ``structural_tag``: an xgrammar structural tag, ``{"type": "structural_tag", "format": ...}``
      as JSON text (forced tool calls: the call markers, the function names, the arguments' schema).

    The embedded and llama.cpp engines compile it with xgrammar and mask the logits row before each
    sampling step; the SGLang engine hands it to SGLang's own sampling parameters of the same names.
    Once the grammar is complete only the model's end-of-sequence tokens are allowed, and reaching
    its end stops generation (also with ``ignore_eos``).
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["json_schema", "regex", "ebnf", "structural_tag"]
    value: str


class SamplingParams(BaseModel):
    """Decoding parameters (OpenAI semantics: temperature 0 is greedy; SGLang's for its extra fields).

    ``top_k`` 0 keeps every token; ``min_p`` drops tokens below ``min_p`` times the most likely
    one's probability (after temperature); ``repetition_penalty`` divides the positive logits (and
    multiplies the negative ones) of tokens generated so far; ``min_tokens`` forbids the stop
    tokens until that many tokens exist; ``ignore_eos`` keeps decoding past the model's
    end-of-sequence tokens (``stop_token_ids`` still stop).
    """

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
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    constraint: Constraint | None = None


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


StageT = TypeVar("StageT")


class SpliceBackend(Protocol[StageT]):
    """Synchronous splice primitives, run where the KV lives (see the module docstring).

    A *stage* (``StageT``, the engine's own type, opaque to the executor) is the new sequence
    under construction. The executor calls ``begin`` (keep the handle's first ``keep`` tokens),
    one ``move`` for the handle's kept runs, then each step in position order (``fill``: compute
    tokens at new positions attending to everything staged before them; ``move`` with a block's
    handle: place a copy of its rows), the ``canary``, and ``commit`` (cache the stage as a
    locked handle, releasing ``previous``). Any exception between ``begin`` and ``commit`` is
    followed by ``abort``; ``commit`` cleans up after its own failures.

    Engines stage a splice in one of three ways, and ``abort`` means something different for
    each:

    * **copy into fresh storage** (embedded): ``move`` copy-rotates the kept runs into newly
      allocated slots and ``fill`` writes new slots; the handle's own slots are never touched,
      so the old path keeps serving others while the stage is built. ``abort`` frees every slot
      the stage allocated: the handle is exactly as before.
    * **in place** (llama.cpp): the stage *is* the handle's own sequence. ``begin`` makes the
      cells past ``keep`` private, the first ``move`` drops what the plan does not keep and
      repositions the kept runs, ``fill`` decodes into the same sequence. ``abort`` cuts the
      sequence back to ``keep`` and says so in the handle (``cached``/``exact``); the handle
      stays valid, and its tail is recomputed when it is used again.
    * **record, then replay at commit** (SGLang): ``begin``/``move``/``fill`` only record the
      steps (nothing is allocated); ``commit`` replays them in position order as SGLang requests
      and control calls inside the scheduler. ``abort`` forgets the record: nothing changed.
      A failure during the replay leaves what was inserted as ordinary evictable cache.

    Capacity problems raise :class:`CapacityError` from any of these calls.
    """

    @property
    def info(self) -> ModelInfo: ...

    @property
    def rotation_budget(self) -> int: ...

    def prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> Prefilled: ...
    def release(self, handle: Handle) -> None: ...
    def rotation_counts(self, handle: Handle, positions: Sequence[int]) -> list[int] | None: ...
    def begin(self, handle: Handle, keep: int) -> StageT: ...
    def move(self, stage: StageT, handle: Handle, runs: Sequence[KeptRun]) -> None: ...
    def fill(self, stage: StageT, at: int, tokens: Sequence[int]) -> None: ...
    def canary(self, stage: StageT, positions: Sequence[int], tokens: Sequence[int]) -> CanaryResult: ...
    def commit(self, stage: StageT, tokens: Sequence[int], exact: int, previous: Handle) -> Handle: ...
    def abort(self, stage: StageT) -> None: ...


class SyncCore(SpliceBackend[StageT], Protocol[StageT]):
    """A synchronous engine core that runs on one thread (embedded, llama.cpp): the splice
    primitives plus decoding, behind :class:`~leyline_server.engines.threaded.ThreadedEngine`."""

    def decode(
        self,
        handle: Handle,
        state: Any,
        params: SamplingParams,
        delivered: Callable[[], int] | None = None,
        processors: Processors | None = None,
    ) -> Generator[GenerationStep, None, None]:
        """Decode after ``handle`` (``state``: its prefill's); when closed, commit the first
        ``delivered()`` generated tokens to ``handle`` (all of them without ``delivered``).
        ``processors`` change each logits row before sampling (constraints, ``min_tokens``)."""
        ...

    def close(self) -> None:
        """Free the core's memory (after its thread stopped)."""
        ...


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

    async def check_constraint(self, constraint: Constraint) -> None:
        """Raise :class:`ConstraintError` unless ``constraint`` can be compiled (before a turn starts)."""
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
