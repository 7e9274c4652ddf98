"""Precompiled KV blocks: token runs whose KV is computed once, kept, and relocated into contexts.

A block (a skill, tool instructions, a retrieved document, user memory) is prefilled alone at
positions ``[0, n)`` and pinned. A directive naming it (``{"block": id}``) places a rotated copy
of its rows where it lands instead of prefilling it (O(n) instead of attention over the whole
context). Blocks belong to the API key that made them (another key's id is unknown to it), count
against the KV pool while kept, and are dropped least recently used past the per-key caps (a
count, and tokens: a quarter of the pool in the server, so one key's blocks never fill it).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from leyline_server.contract.values import Handle

__all__ = ["Block", "BlockStore"]


@dataclass(eq=False)
class Block:
    """One kept block: its id, owner and pinned handle (``handle.tokens`` are its tokens)."""

    id: str
    owner: str | None
    handle: Handle
    last_used: float = 0.0
    users: int = 0  # requests holding its handle (see BlockStore.using)
    dropped: bool = False  # dropped while in use: released when the last user is done

    @property
    def tokens(self) -> list[int]:
        """The block's tokens."""
        return list(self.handle.tokens)


class BlockStore:
    """Blocks by id, least recently used first, at most ``max_per_key`` per key."""

    def __init__(
        self,
        release: Callable[[Handle], None],
        max_per_key: int = 256,
        clock: Callable[[], float] = time.monotonic,
        max_tokens_per_key: int | None = None,
    ) -> None:
        if max_per_key <= 0 or (max_tokens_per_key is not None and max_tokens_per_key <= 0):
            raise ValueError("max_per_key and max_tokens_per_key must be positive")
        self._blocks: OrderedDict[str, Block] = OrderedDict()
        self._release = release
        self.max_per_key = max_per_key
        self.max_tokens_per_key = max_tokens_per_key
        self._clock = clock

    def __len__(self) -> int:
        return len(self._blocks)

    @staticmethod
    def new_id() -> str:
        """An unguessable block id."""
        return "blk_" + secrets.token_urlsafe(15)

    def add(self, block_id: str, owner: str | None, handle: Handle) -> Block:
        """Keep a prefilled block (dropping the owner's least recently used ones past the caps)."""
        mine = [b for b in self._blocks.values() if b.owner == owner]
        for old in mine[: max(len(mine) - self.max_per_key + 1, 0)]:
            self.drop(old)
        if self.max_tokens_per_key is not None:
            held = sum(len(b.handle.tokens) for b in self._blocks.values() if b.owner == owner)
            for old in [b for b in self._blocks.values() if b.owner == owner]:
                if held + len(handle.tokens) <= self.max_tokens_per_key:
                    break
                held -= len(old.handle.tokens)
                self.drop(old)
        block = Block(block_id, owner, handle, self._clock())
        self._blocks[block_id] = block
        return block

    def get(self, block_id: str, owner: str | None) -> Block | None:
        """The block, if it exists and belongs to ``owner`` (marked as just used)."""
        block = self._blocks.get(block_id)
        if block is None or block.owner != owner:
            return None
        block.last_used = self._clock()
        self._blocks.move_to_end(block_id)
        return block

    def resolve(self, names: Iterable[str | None], owner: str | None) -> dict[str, Handle]:
        """The handles of the named blocks ``owner`` may use (unknown names are left out).

        Hold them with :meth:`using` while an engine job may read them.
        """
        found = {}
        for name in names:
            if name is not None and (block := self.get(name, owner)) is not None:
                found[name] = block.handle
        return found

    @contextmanager
    def using(self, names: Iterable[str | None], owner: str | None) -> Iterator[dict[str, Handle]]:
        """:meth:`resolve`, the handles kept pinned until the block ends even if the blocks are
        dropped meanwhile (a newer block past the key's caps): a request never reads released KV."""
        found = self.resolve(names, owner)
        held = [self._blocks[name] for name in found]
        for block in held:
            block.users += 1
        try:
            yield found
        finally:
            for block in held:
                block.users -= 1
                if block.dropped and not block.users:
                    self._release(block.handle)

    def drop(self, block: Block) -> None:
        """Forget a block and release its KV (once no request holds it)."""
        if self._blocks.pop(block.id, None) is not None:
            if block.users:
                block.dropped = True
            else:
                self._release(block.handle)

    def all(self) -> list[Block]:
        """Every kept block (a snapshot)."""
        return list(self._blocks.values())
