"""Composable KV blocks, SDK side: ``client.blocks`` and block messages placed by relocation.

A *block* is a run of tokens whose KV the server computes once and keeps (a skill, tool
instructions, a document). A directive naming it — ``Directive(start=p, end=p, replacement=
block.tokens, block=block.id)`` — makes the server relocate that KV to where it lands (a RoPE
rotation) instead of prefilling it::

    block = await client.blocks.create(tokens=ids)            # or messages=[...], tools=[...]
    await client.blocks.retrieve(block.id); await client.blocks.delete(block.id)

In a session, a message is a *block message* when it carries ``"leyline_block": True`` (the SDK
strips the key before rendering and sending) or was registered with
``session.add_block_message(message)``. When one is new in the effective history and lies after
everything the server's base covers, :func:`place_blocks` creates (or reuses, by a digest of the
tokens) a block holding the message's *exact* rendered tokens — its span in the prompt — and
inserts it at the end of the base: the tokens between the base and the block as a plain
insertion, then the block. ``apply(base, D)`` is checked to equal the prompt up to the block's
end; anything that does not check out sends no block directive (the server prefills the
message) and the reason goes to ``TurnStats.block_fallback``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leyline_sdk.core.directives import Directive, Mode, apply, digest, truncate_result
from leyline_sdk.core.fallbacks import BlockFallback
from leyline_sdk.core.validation import check_messages, check_tools
from leyline_sdk.core.wire import BlockInfo
from leyline_sdk.render.rendering import RenderedConversation
from leyline_sdk.session.port import LeylineRoutes

__all__ = [
    "BLOCK_KEY",
    "Block",
    "Blocks",
    "Placement",
    "block_fingerprint",
    "strip_block_marks",
    "place_blocks",
    "with_repair",
]

BLOCKS_PATH = "/leyline/blocks"
BLOCK_KEY = "leyline_block"  # message-level marker, stripped before anything is sent
Block = BlockInfo


class Blocks:
    """``client.blocks``: create, retrieve and delete blocks; reuse them by content.

    ``for_tokens`` (used by sessions) returns a known block with exactly these tokens or creates
    one; a block whose use the server reported as failed is verified (``GET``) before it is used
    again. A server without the blocks routes is remembered (``available is False``). Errors are
    openai's (``openai.NotFoundError`` for an unknown block or another key's).
    """

    def __init__(self, routes: LeylineRoutes, max_known: int = 1024) -> None:
        self.routes = routes
        self.available: bool | None = None
        self.max_known = max_known
        self._known: OrderedDict[str, Block] = OrderedDict()  # digest(tokens) -> block
        self._suspect: set[str] = set()

    async def create(
        self,
        *,
        tokens: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Block:
        """Create a block from token ids, or from messages (their exact rendered tokens, no preamble)."""
        if (tokens is None) == (messages is None):
            raise ValueError("give exactly one of tokens= and messages=")
        body: dict[str, Any]
        if tokens is not None:
            ids = list(tokens)
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise ValueError("tokens must be a non-empty list of token ids (ints >= 0)")
            body = {"tokens": ids}
        else:
            body = {"messages": strip_block_marks(check_messages(messages))[0]}
            if tools:
                body["tools"] = check_tools(tools)
        block = Block.model_validate(await self.routes.post(BLOCKS_PATH, body))
        self.available = True
        self._remember(block)
        return block

    async def retrieve(self, block_id: str) -> Block:
        """A block's tokens (``openai.NotFoundError`` if unknown or another key's)."""
        return Block.model_validate(await self.routes.get(f"{BLOCKS_PATH}/{block_id}"))

    async def delete(self, block_id: str) -> None:
        """Delete a block (``openai.NotFoundError`` if unknown or another key's); it is forgotten here too."""
        self.forget(block_id)
        await self.routes.delete(f"{BLOCKS_PATH}/{block_id}")

    def forget(self, block_id: str) -> None:
        """Stop reusing ``block_id`` (the next use of its tokens creates a new block)."""
        for key in [k for k, b in self._known.items() if b.id == block_id]:
            del self._known[key]
        self._suspect.discard(block_id)

    def suspect(self, block_ids: Iterable[str]) -> None:
        """The server reported a fallback on a request that used these: verify before reusing them."""
        self._suspect.update(block_ids)

    def _remember(self, block: Block) -> None:
        key = digest(block.tokens)
        self._known[key] = block
        self._known.move_to_end(key)
        while len(self._known) > self.max_known:
            self._known.popitem(last=False)

    async def for_tokens(self, tokens: Sequence[int]) -> tuple[Block | None, str | None]:
        """(a block holding exactly ``tokens``, ``None``) or (``None``, why not); never raises."""
        if self.available is False:
            return None, "blocks_unsupported"
        known = self._known.get(digest(tokens))
        if known is not None and known.id in self._suspect:
            try:
                await self.retrieve(known.id)
                self._suspect.discard(known.id)
            except self.routes.not_found:
                self.forget(known.id)
                known = None
            except self.routes.failure:
                return None, "block_unverified"
        if known is not None:
            self._known.move_to_end(digest(tokens))
            return known, None
        try:
            block = await self.create(tokens=tokens)
        except self.routes.not_found as exc:
            if getattr(exc, "code", None) is None:  # no such route: a server without blocks
                self.available = False
                return None, "blocks_unsupported"
            return None, "block_create_failed"
        except self.routes.failure:
            return None, "block_create_failed"
        if block.tokens != list(tokens) or block.length != len(tokens):
            self.forget(block.id)
            return None, "block_mismatch"
        return block, None


def block_fingerprint(message: Mapping[str, Any]) -> str:
    """A stable key of a message's content (the marker left out), for ``add_block_message``."""
    clean = {k: v for k, v in message.items() if k != BLOCK_KEY and v is not None}
    return json.dumps(clean, sort_keys=True, ensure_ascii=False, default=str)


def strip_block_marks(
    messages: Sequence[Mapping[str, Any]], fingerprints: Iterable[str] = ()
) -> tuple[list[dict[str, Any]], set[int]]:
    """The messages without the block marker, and the indices of block messages (marked or registered)."""
    prints = set(fingerprints)
    out: list[dict[str, Any]] = []
    indices: set[int] = set()
    for i, message in enumerate(messages):
        if message.get(BLOCK_KEY) or (prints and block_fingerprint(message) in prints):
            indices.add(i)
        out.append({k: v for k, v in message.items() if k != BLOCK_KEY})
    return out, indices


def with_repair(directives: Sequence[Directive], repair: int) -> list[Directive]:
    """``directives`` with ``repair`` (seam repair: the first ``repair`` tokens after the replacement
    get fresh KV) on every ``amortize`` one; ``forget`` recomputes everything anyway."""
    if not repair:
        return list(directives)
    return [d.model_copy(update={"repair": repair}) if d.mode is Mode.AMORTIZE else d for d in directives]


def _trailing_forget_as_amortize(directives: Sequence[Directive], base_length: int) -> list[Directive]:
    """The only ``forget``, when it is the last directive and ends at the base's end, as ``amortize``.

    Nothing of the base survives after it, so both modes compute the same: the prefix before it
    keeps its KV, the replacement and everything after are prefilled.
    """
    out = list(directives)
    forgets = [i for i, d in enumerate(out) if d.mode is Mode.FORGET]
    if forgets == [len(out) - 1] and out[-1].end == base_length:
        out[-1] = out[-1].model_copy(update={"mode": Mode.AMORTIZE})
    return out


@dataclass
class Placement:
    """The directives to send, how many blocks they place, which, and why any was not placed."""

    directives: list[Directive]
    placed: int = 0
    block_ids: list[str] = field(default_factory=list)
    reason: str | None = None


async def place_blocks(
    blocks: Blocks,
    base: Sequence[int],
    directives: Sequence[Directive],
    prompt: RenderedConversation,
    indices: Iterable[int],
    repair: int = 0,
    floor: int | None = None,
) -> Placement:
    """``directives`` plus insertions that place the new block messages ``indices`` of ``prompt``.

    Only messages starting at or after ``floor`` are placed (the session passes where the
    messages the server has seen end; default: the end of ``apply(base, directives)``). Where the
    result reaches into the first of them (the old generation prompt or generated tokens matched
    its first tokens), the directives are cut back to its start (:func:`truncate_result`).

    The server never places a block after a ``forget``, so none may remain — except a last one
    that runs to the base's end (the cut of generated tokens the agent did not keep): no base
    token survives after it, so it is sent as the equal ``amortize`` replacement. Each block
    directive is ``Directive(start=len(base), end=len(base), replacement=<the span's tokens>,
    block=id, repair=repair)``, preceded by a plain insertion of the prompt tokens between the
    previous placement and the span. The result is verified: ``apply(base, D)`` equals the prompt
    up to the last placed block. Anything else returns ``directives`` unchanged, with the reason.
    """
    original = list(directives)
    result = apply(base, original)
    floor = len(result) if floor is None else floor
    spans = [prompt.message_spans[j] for j in sorted(indices) if 0 <= j < len(prompt.message_spans)]
    spans = [s for s in spans if s.start >= floor and s.end > s.start]
    if not spans:
        return Placement(original)
    out = original
    if spans[0].start < len(result):
        out = truncate_result(len(base), out, spans[0].start)
        result = apply(base, out)
    out = _trailing_forget_as_amortize(out, len(base))
    if any(d.mode is Mode.FORGET for d in out):
        return Placement(original, reason="forget")
    if prompt.tokens[: len(result)] != result:
        return Placement(original, reason=BlockFallback.PROMPT_MISMATCH.value)
    end, ids, reason, pos = len(base), [], None, len(result)
    for span in spans:
        tokens = prompt.tokens[span.start : span.end]
        block, why = await blocks.for_tokens(tokens)
        if block is None:
            reason = reason or why
            continue
        if span.start > pos:
            out.append(Directive(start=end, end=end, replacement=tuple(prompt.tokens[pos : span.start])))
        out.append(Directive(start=end, end=end, replacement=tuple(tokens), block=block.id, repair=repair))
        ids.append(block.id)
        pos = span.end
    if not ids:
        return Placement(original, reason=reason)
    if apply(base, out) != prompt.tokens[:pos]:
        return Placement(original, reason="block_mismatch")
    return Placement(out, len(ids), ids, reason)
