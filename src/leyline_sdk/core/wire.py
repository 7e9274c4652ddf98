"""The Leyline extension on the wire: one set of pydantic models shared by the server and the SDK.

Request side (``"leyline"`` in a chat completion body, sent by the openai client through
``extra_body``)::

    {"session_id": "…", "base": {"length": 1234, "digest": "sha256:…"},
     "directives": [{"start": 100, "end": 400, "replacement": [..], "mode": "amortize"}],
     "strict": false}

Response side: :class:`LeylineResult` (the ``leyline`` field of a chat completion, also on the
last streamed chunk), :class:`DirectivesResult` (``POST /v1/leyline/sessions/{id}/directives``)
and :class:`SessionInfo` (the sessions routes). Unknown fields are kept (``extra="allow"``) so
an older SDK survives a newer server.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from leyline_sdk.core.directives import Directive

__all__ = [
    "BaseRef",
    "BlockInfo",
    "DirectivesResult",
    "FallbackInfo",
    "LeylineRequest",
    "LeylineResult",
    "SessionInfo",
    "SpliceCounts",
]


class BaseRef(BaseModel):
    """A session's base as a client sees it: its length and digest (see ``directives.digest``)."""

    model_config = ConfigDict(extra="forbid")

    length: int = Field(ge=0)
    digest: str | None = None


class LeylineRequest(BaseModel):
    """The ``leyline`` extension of a chat completion request.

    An empty object opens a new session. ``session_id`` continues one; an unknown id is served
    as a new session and reported (``fallback.code == "base_mismatch"``), or answered 404 when
    ``strict``. ``base``, when sent, is always checked against the session's base.
    """

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    base: BaseRef | None = None
    directives: list[Directive] = Field(default_factory=list)
    strict: bool = False


class FallbackInfo(BaseModel):
    """Why an edit was not spliced as asked: a stable code and a message."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str = ""


class SpliceCounts(BaseModel):
    """What happened to the prompt's tokens.

    ``reused_tokens`` kept their KV where it was, ``rotated_tokens`` kept it moved by a RoPE
    δ-rotation, ``prefilled_tokens`` were computed for this request. ``approximate_tokens`` counts
    prompt tokens whose KV differs from a fresh prefill's (rotated, or computed after rotated KV);
    it is 0 for every client that never asked for ``amortize``. ``cached_tokens`` in OpenAI's
    ``usage`` equals ``reused_tokens + rotated_tokens``.
    """

    model_config = ConfigDict(extra="allow")

    applied: bool = True
    fallback: FallbackInfo | None = None
    reused_tokens: int = 0
    rotated_tokens: int = 0
    prefilled_tokens: int = 0
    approximate_tokens: int = 0
    canary: str = "skipped"
    splice_ms: float = 0.0


class LeylineResult(SpliceCounts):
    """The ``leyline`` field of a chat completion response.

    ``base`` is the session's base after this turn (prompt + completion): send it back with the
    next directives. ``completion_token_ids`` are the generated tokens, so a client can rebuild
    the base without re-tokenizing. For a plain client whose conversation the server recognised
    (``auto_splice``), ``sources`` says who made each directive the server derived
    (``"template"``: the chat template rendered unchanged messages differently, e.g. dropped
    earlier reasoning; ``"client"``: the client edited its own history, spliced in ``amortize``
    mode only under its opt-in, else recomputed) and ``template_directives`` /
    ``client_directives`` count them. ``timings`` says where the server's time to the first token
    went, in milliseconds (``admit``, ``render``, ``constrain``, ``reserve``, ``queue``, ``splice``,
    ``prefill``, ``first_token`` and their ``total``; see the server's docs).
    """

    session_id: str | None = None
    base: BaseRef | None = None
    auto_splice: bool = False
    completion_token_ids: list[int] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    template_directives: int = 0
    client_directives: int = 0
    timings: dict[str, float] = Field(default_factory=dict)


class SessionInfo(BaseModel):
    """A session as the sessions routes return it (``tokens`` only where asked for)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "leyline.session"
    base: BaseRef
    tokens: list[int] | None = None


class DirectivesResult(SpliceCounts):
    """The answer of ``POST /v1/leyline/sessions/{id}/directives``: the new base and the counts."""

    id: str
    object: str = "leyline.session"
    base: BaseRef


class BlockInfo(BaseModel):
    """A precompiled KV block as ``/v1/leyline/blocks`` returns it: its id and exact tokens.

    Blocks belong to the key that made them; a directive ``{"block": id}`` places the block's KV
    by relocation instead of prefilling its tokens.
    """

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "leyline.block"
    length: int = Field(ge=0)
    tokens: list[int] = Field(default_factory=list)
