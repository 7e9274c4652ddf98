"""The engine seam's value types: handles, scopes, model info, sampling, turns, steps.

What crosses the seam between the service and an engine (:mod:`leyline_server.contract.base`
holds the contract itself). Everything here is a plain value: no engine, no HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self

if TYPE_CHECKING:
    from leyline_sdk.core.directives import Directive
    from leyline_server.contract.report import SpliceReport

__all__ = [
    "CacheScope",
    "SHARED",
    "CanaryResult",
    "CapacityError",
    "Constraint",
    "ConstraintError",
    "GenerationStep",
    "Handle",
    "ModelInfo",
    "Prefilled",
    "PrefillProgress",
    "SamplingParams",
    "SpliceRequest",
    "TokenLogprob",
    "Turn",
    "Logits",
    "kept_on_cancel",
    "set_kept",
]

# The last prompt position's logits, in the engine's own array type: a torch tensor (embedded), a
# numpy row (llama.cpp), or None where the engine keeps them itself (SGLang).
Logits = Any


class CapacityError(RuntimeError):
    """The KV cache cannot hold the tokens, even after evicting everything unlocked."""


_KEPT = "leyline_kept_handle"


def set_kept(cancelled: BaseException, handle: Handle | None) -> None:
    """Mark a turn's cancellation with the session handle the engine gave back untouched."""
    setattr(cancelled, _KEPT, handle)


def kept_on_cancel(exc: BaseException) -> Handle | None:
    """The session handle a cancelled ``start_turn`` gave back (``None``: it was released).

    A cancelled prefill hands the session's base back on the :class:`asyncio.CancelledError`
    itself — the old one, or the spliced one if the turn's splice had finished (one cut half-way
    releases it) — so the session survives its client leaving.
    """
    return getattr(exc, _KEPT, None)


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
    retracts: bool = False  # a stream is retracted when the pool runs short (KV reserved as it is used)


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

    @classmethod
    def of(cls, handle: Handle) -> Self:
        """``handle`` as this engine's own handle type (``cls``); ``TypeError`` for another engine's."""
        if not isinstance(handle, cls):
            raise TypeError(f"not a handle of this engine: a {type(handle).__name__}, not a {cls.__name__}")
        return handle


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
    repetition_penalty: float = Field(default=1.0, ge=1e-6, le=2.0)
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
    """A prefill's result: the pinned sequence, reused tokens (of which approximate), the last logits."""

    handle: Handle
    reused: int
    approximate: int
    last_logits: Logits = None


@dataclass
class PrefillProgress:
    """How far a turn's prefill has come: ``tokens[:done]`` of ``total`` prompt tokens hold KV,
    ``reused`` of them found cached. Written by the engine as chunks complete, read by the server
    (a log line when a client leaves during its prefill); an engine that cannot tell leaves them 0."""

    total: int = 0
    reused: int = 0
    done: int = 0


class CanaryResult(NamedTuple):
    """The layer-0 canary: ``ran`` False means the engine cannot read its keys back."""

    ran: bool
    error: float = 0.0
    tolerance: float = 0.0


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
    last_logits: Logits = None
    generated: list[int] = field(default_factory=list)
    owner: str | None = None  # the key whose turn it is (schedulers let keys take turns)
    timings: dict[str, float] = field(default_factory=dict)  # ms: queue, splice, prefill (where measured)

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
