"""Stored responses (``store`` is true by default): a response, its input items, its conversation.

Private to the key that made them (another key's id is unknown: 404, as for an id never made),
bounded per key in count and in tokens (prompt + completion of each), idle ones expire after a
TTL, least recently used first out. The KV of a stored response's conversation is its session's
(:mod:`leyline_server.api.conversations`); continuing from it (``previous_response_id``) is a
request that carries its reply, so the same session continues and the prefix is a cache hit.
Dropping a stored response drops only the record: the session follows its own limits.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StoredResponse", "ResponseStore"]


@dataclass
class StoredResponse:
    """A response as stored: the response object, its input items, its conversation as chat
    messages (without instructions: they do not carry over) and its size in tokens."""

    id: str
    owner: str | None
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]
    tokens: int
    last_used: float = 0.0
    items: dict[str, dict[str, Any]] = field(default_factory=dict)  # item id -> item (input and output)


class ResponseStore:
    """Stored responses per key: at most ``max_per_key`` and ``max_tokens_per_key``, ``ttl_s`` idle."""

    def __init__(
        self,
        max_per_key: int = 256,
        max_tokens_per_key: int = 4_000_000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_per_key < 1 or max_tokens_per_key < 1 or ttl_s <= 0:
            raise ValueError("response store limits must be positive")
        self.max_per_key, self.max_tokens_per_key, self.ttl_s = max_per_key, max_tokens_per_key, ttl_s
        self._clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently used first
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self) -> None:
        now = self._clock()
        for stored in [s for s in self._items.values() if now - s.last_used > self.ttl_s]:
            self._drop(stored)

    def _drop(self, stored: StoredResponse) -> None:
        if self._items.pop(stored.id, None) is not None:
            self.dropped += 1

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``; the key's least recently used ones go first past its bounds."""
        self._expire()
        stored.last_used = self._clock()
        stored.items = {i["id"]: i for i in [*stored.input_items, *stored.response.get("output", [])] if "id" in i}
        self._items[stored.id] = stored
        mine = [s for s in self._items.values() if s.owner == stored.owner]  # least recently used first
        total = sum(s.tokens for s in mine)
        while mine[0] is not stored and (len(mine) > self.max_per_key or total > self.max_tokens_per_key):
            old = mine.pop(0)
            total -= old.tokens
            self._drop(old)

    def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        """The stored response, if it exists and is ``owner``'s (touched: most recently used)."""
        self._expire()
        stored = self._items.get(response_id)
        if stored is None or stored.owner != owner:
            return None
        stored.last_used = self._clock()
        self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str, owner: str | None) -> bool:
        """Remove ``owner``'s stored response; ``False`` if unknown."""
        stored = self.get(response_id, owner)
        if stored is None:
            return False
        self._drop(stored)
        return True

    def item(self, owner: str | None) -> Callable[[str], Mapping[str, Any] | None]:
        """A lookup of ``owner``'s stored items by id (for ``item_reference``)."""

        def find(item_id: str) -> Mapping[str, Any] | None:
            for stored in reversed(self._items.values()):
                if stored.owner == owner and item_id in stored.items:
                    return stored.items[item_id]
            return None

        return find
