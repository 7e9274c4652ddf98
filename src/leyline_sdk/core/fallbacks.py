"""The fallback vocabulary: why an edit was not spliced as asked. One list for the server and the SDK.

A fallback is never an error by default: the request is served exactly (the cache is recomputed
from the edit on: ``forget``) and the code says why. ``strict`` turns it into an error.

Server codes (:data:`SERVER_CODES`) come back in a response's ``leyline.fallback.code``:

=========================== ===============================================================
``base_mismatch``           unknown or dropped session, or the client's base differs
``span_invalid``            a directive out of range, overlapping or unsorted
``token_invalid``           a replacement token that is not in the vocabulary
``prompt_mismatch``         ``apply(base, D)`` is not a prefix of the prompt
``rope_unsupported``        the model's positions cannot be shifted (dynamic NTK, ALiBi-less absolute …)
``drift_budget``            a slot would pass its rotation budget
``canary_failed``           the layer-0 canary disagreed with the rotated keys
``capacity``                no room in the KV pool: idle sessions dropped, served as a forget
``context_length_exceeded`` the directives' result would not fit the context
=========================== ===============================================================

SDK codes (:data:`SDK_CODES`) are set by the SDK itself, in ``TurnStats.fallback``, when it sends
no directives:

=========================== ===============================================================
``session_not_found``       the server no longer has the session (``sync_edits``)
``tokenizer_mismatch``      the client's rendering disagrees with the server's tokens
``base_mismatch``           the client does not know the server's base (also a server code)
``prompt_mismatch``         the client's directives do not reproduce the prompt (also a server code)
=========================== ===============================================================

Block placements have their own reasons (:class:`BlockFallback`, in ``TurnStats.block_fallback``).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["FallbackCode", "BlockFallback", "SERVER_CODES", "SDK_CODES"]


class FallbackCode(str, Enum):
    """Why an edit was not spliced as asked (stable; reported to clients and in ``TurnStats``)."""

    BASE_MISMATCH = "base_mismatch"
    SPAN_INVALID = "span_invalid"
    TOKEN_INVALID = "token_invalid"
    PROMPT_MISMATCH = "prompt_mismatch"
    ROPE_UNSUPPORTED = "rope_unsupported"
    DRIFT_BUDGET = "drift_budget"
    CANARY_FAILED = "canary_failed"
    CAPACITY = "capacity"
    CONTEXT_LENGTH = "context_length_exceeded"
    SESSION_NOT_FOUND = "session_not_found"
    TOKENIZER_MISMATCH = "tokenizer_mismatch"


SERVER_CODES = frozenset(
    {
        FallbackCode.BASE_MISMATCH,
        FallbackCode.SPAN_INVALID,
        FallbackCode.TOKEN_INVALID,
        FallbackCode.PROMPT_MISMATCH,
        FallbackCode.ROPE_UNSUPPORTED,
        FallbackCode.DRIFT_BUDGET,
        FallbackCode.CANARY_FAILED,
        FallbackCode.CAPACITY,
        FallbackCode.CONTEXT_LENGTH,
    }
)
SDK_CODES = frozenset(
    {
        FallbackCode.SESSION_NOT_FOUND,
        FallbackCode.TOKENIZER_MISMATCH,
        FallbackCode.BASE_MISMATCH,
        FallbackCode.PROMPT_MISMATCH,
    }
)


class BlockFallback(str, Enum):
    """Why a new block message was prefilled instead of placed by relocation."""

    NO_BASE = "no_base"  # a new session has no base to insert a block into
    GATEWAY = "gateway"  # behind a gateway the blocks routes are out of reach
    FORGET = "forget"  # the turn recomputes from before the block anyway
    PROMPT_MISMATCH = "prompt_mismatch"  # the placement does not reproduce the prompt
    BLOCK_MISMATCH = "block_mismatch"  # the server's block holds other tokens
    BLOCKS_UNSUPPORTED = "blocks_unsupported"  # the server has no blocks routes
    BLOCK_UNVERIFIED = "block_unverified"  # a suspect block could not be checked
    BLOCK_CREATE_FAILED = "block_create_failed"  # creating the block failed
