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

from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from leyline_server.contract.values import (
    CacheScope,
    CanaryResult,
    Constraint,
    GenerationStep,
    Handle,
    Logits,
    ModelInfo,
    Prefilled,
    PrefillProgress,
    SamplingParams,
    SpliceRequest,
    Turn,
)

if TYPE_CHECKING:
    from leyline_sdk.core.directives import KeptRun
    from leyline_server.contract.jobs import Chunk, DecodeJob, PrefillJob, StepFailures
    from leyline_server.contract.logits import Processors
    from leyline_server.contract.report import SpliceReport

__all__ = ["Engine", "SpliceBackend", "StageT", "SyncCore"]


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
    primitives plus batched steps (prefill chunks and decode tokens of many sequences in one
    forward), driven by :class:`~leyline_server.engines.scheduler.Scheduler` behind
    :class:`~leyline_server.engines.threaded.ThreadedEngine`. The jobs' lives are drawn in
    :mod:`leyline_server.contract.jobs`.

    ``prefill`` (from :class:`SpliceBackend`) and ``decode`` are the same primitives driven for one
    sequence (:mod:`leyline_server.engines.stepping`): the splice executor, tests and benchmarks
    use them.
    """

    def start_prefill(self, tokens: Sequence[int], scope: CacheScope, previous: Handle | None = None) -> PrefillJob:
        """Match and lock the longest prefix of ``tokens`` cached in ``scope`` (or take over
        ``previous``'s cache); compute nothing yet. At least the last token is left to compute."""
        ...

    def forward(self, chunks: Sequence[Chunk], decodes: Sequence[DecodeJob]) -> StepFailures:
        """One step: each chunk's next tokens and each decode's ``pending`` token, in one forward
        where the engine can. A chunk that completes its job sets ``job.logits``; each decode gets
        the logits its next ``sample`` reads (valid until the next ``forward``). Jobs that could not
        be advanced (:class:`CapacityError`) are returned with their error; the others advanced."""
        ...

    def finish_prefill(self, job: PrefillJob) -> Prefilled:
        """Cache the prefilled sequence as a locked handle; ``job.previous`` is released."""
        ...

    def abort_prefill(self, job: PrefillJob) -> None:
        """Give back what ``job`` took (``job.previous`` stays with the caller)."""
        ...

    def start_decode(
        self, handle: Handle, last_logits: Logits, params: SamplingParams, processors: Processors | None = None
    ) -> DecodeJob:
        """A decode job after ``handle`` (``last_logits``: its prefill's)."""
        ...

    def sample(self, job: DecodeJob) -> GenerationStep:
        """The next token from ``job``'s logits (``finish_reason`` set, and ``job.finished``, when
        it ends the stream; otherwise it becomes ``job.pending``)."""
        ...

    def finish_decode(self, job: DecodeJob, delivered: int) -> None:
        """Keep the first ``delivered`` generated tokens on ``job.handle`` (KV for all but one
        not computed yet); drop the KV of any generated after them. A retracted job's handle
        keeps what is still cached of them (``handle.cached`` may then be shorter)."""
        ...

    def retract_decode(self, job: DecodeJob) -> None:
        """Give back the pool room a running job holds (between steps, ``pending`` set): its KV
        becomes cache the pool may reclaim, or is parked out of the pool; its generated tokens,
        sampler and processors stay with it (``job.retracted``)."""
        ...

    def resume_decode(self, job: DecodeJob, prefilled: Prefilled) -> None:
        """Bind a retracted job to ``prefilled``, the finished prefill of its
        :func:`~leyline_server.contract.jobs.context` (started with ``previous=job.handle``): it
        decodes on from ``pending``."""
        ...

    def decode(
        self,
        handle: Handle,
        last_logits: Logits,
        params: SamplingParams,
        delivered: Callable[[], int] | None = None,
        processors: Processors | None = None,
    ) -> Generator[GenerationStep, None, None]:
        """Decode after ``handle`` (``last_logits``: its prefill's); when closed, commit the first
        ``delivered()`` generated tokens to ``handle`` (all of them without ``delivered``).
        ``processors`` change each logits row before sampling (constraints, ``min_tokens``)."""
        ...

    def close(self) -> None:
        """Free the core's memory (after its thread stopped)."""
        ...


class Engine(Protocol):
    """The service-facing engine: asynchronous, engine-agnostic (see the module docstring)."""

    @property
    def info(self) -> ModelInfo: ...

    async def open(self, tokens: Sequence[int], scope: CacheScope, owner: str | None = None) -> Handle:
        """Prefill ``tokens`` and return them pinned (a new session's base); ``owner``: the key."""
        ...

    async def start_turn(
        self,
        prompt: Sequence[int],
        scope: CacheScope,
        session: Handle | None,
        splice: SpliceRequest | None,
        owner: str | None = None,
        progress: PrefillProgress | None = None,
    ) -> Turn:
        """Splice ``session`` if asked (falling back as the report says), then prefill ``prompt``.

        ``session`` is consumed unless ``SpliceError`` (strict) is raised; after any other error
        (``CapacityError``) it has been released. ``owner``: the key whose turn it is (an engine
        that schedules lets keys take turns; ``Turn.owner``). ``progress``: kept up to date as the
        prefill's chunks complete, where the engine can tell. Cancelling the call gives the prefill
        up (at its next chunk, on an engine that computes in chunks) and releases what it took.
        """
        ...

    async def check_constraint(self, constraint: Constraint) -> None:
        """Raise :class:`ConstraintError` unless ``constraint`` can be compiled (before a turn starts)."""
        ...

    def constraint_ready(self, constraint: Constraint) -> bool:
        """Whether :meth:`check_constraint` would answer at once (compiled already, or nothing to compile)."""
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
