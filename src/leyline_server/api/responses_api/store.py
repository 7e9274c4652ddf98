"""Stored responses (``store`` is true by default): a response, its input items, its conversation.

Private to the key that made them (another key's id is unknown: 404, as for an id never made),
bounded per key in count, in tokens (prompt + completion of each) and in bytes (the JSON of all
that is kept: the response with everything it echoes, its input items as sent, its conversation),
idle ones expire after a TTL, least recently used first out. A response larger than a bound by
itself is kept alone. The KV of a stored response's conversation is its session's
(:mod:`leyline_server.api.conversations`); continuing from it (``previous_response_id``) is a
request that carries its reply, so the same session continues and the prefix is a cache hit.
Dropping a stored response drops only the record: the session follows its own limits.

Items are found by id (``item_reference``) through an index, the newest response holding the id
first: an ``item_reference`` among a response's input items is a reference, not an item, and is
not indexed (it would shadow the item it names). An expired response's items are gone with it.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StoredResponse", "ResponseStore", "stored_bytes"]

Owner = str | None


@dataclass
class StoredResponse:
    """A response as stored: the response object, its input items, its conversation as chat
    messages (without instructions: they do not carry over), its size in tokens and in bytes."""

    id: str
    owner: Owner
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]
    tokens: int
    last_used: float = 0.0
    items: dict[str, dict[str, Any]] = field(default_factory=dict)  # item id -> item (input and output)
    size: int = 0  # bytes: stored_bytes(self), set when stored


def stored_bytes(stored: StoredResponse) -> int:
    """The bytes a stored response keeps: the UTF-8 JSON of its response, input items and history."""
    parts = (stored.response, stored.input_items, stored.history)
    return sum(len(json.dumps(p, ensure_ascii=False, default=str).encode("utf-8", "replace")) for p in parts)


def _indexed(stored: StoredResponse) -> dict[str, dict[str, Any]]:
    """The items ``item_reference`` may name: input and output items with a string id, no reference."""
    found = [*stored.input_items, *stored.response.get("output", [])]
    return {i["id"]: i for i in found if isinstance(i.get("id"), str) and i.get("type") != "item_reference"}


class ResponseStore:
    """Stored responses per key: at most ``max_per_key``, ``max_tokens_per_key`` and
    ``max_bytes_per_key``, ``ttl_s`` idle."""

    def __init__(
        self,
        max_per_key: int = 256,
        max_tokens_per_key: int = 4_000_000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        max_bytes_per_key: int = 64 * 2**20,
    ) -> None:
        if min(max_per_key, max_tokens_per_key, max_bytes_per_key) < 1 or ttl_s <= 0:
            raise ValueError("response store limits must be positive")
        self.max_per_key, self.max_tokens_per_key, self.ttl_s = max_per_key, max_tokens_per_key, ttl_s
        self.max_bytes_per_key = max_bytes_per_key
        self._clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # least recently used first
        self._index: dict[tuple[Owner, str], list[str]] = {}  # (owner, item id) -> response ids, oldest first
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def bytes_of(self, owner: Owner) -> int:
        """The bytes ``owner``'s stored responses keep."""
        return sum(s.size for s in self._items.values() if s.owner == owner)

    def _expired(self, stored: StoredResponse, now: float) -> bool:
        return now - stored.last_used > self.ttl_s

    def _expire(self) -> None:
        now = self._clock()
        for stored in [s for s in self._items.values() if self._expired(s, now)]:
            self._drop(stored)

    def _drop(self, stored: StoredResponse) -> None:
        if self._items.pop(stored.id, None) is None:
            return
        self.dropped += 1
        for item_id in stored.items:
            ids = self._index.get((stored.owner, item_id))
            if ids is not None and stored.id in ids:
                ids.remove(stored.id)
                if not ids:
                    del self._index[(stored.owner, item_id)]

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``; the key's least recently used ones go first past its bounds."""
        self._expire()
        stored.last_used = self._clock()
        stored.items = _indexed(stored)
        stored.size = stored.size or stored_bytes(stored)
        self._items[stored.id] = stored
        for item_id in stored.items:
            self._index.setdefault((stored.owner, item_id), []).append(stored.id)
        mine = [s for s in self._items.values() if s.owner == stored.owner]  # least recently used first
        tokens, size = sum(s.tokens for s in mine), sum(s.size for s in mine)
        while mine[0] is not stored and (
            len(mine) > self.max_per_key or tokens > self.max_tokens_per_key or size > self.max_bytes_per_key
        ):
            old = mine.pop(0)
            tokens, size = tokens - old.tokens, size - old.size
            self._drop(old)

    def get(self, response_id: str, owner: Owner) -> StoredResponse | None:
        """The stored response, if it exists and is ``owner``'s (touched: most recently used)."""
        self._expire()
        stored = self._items.get(response_id)
        if stored is None or stored.owner != owner:
            return None
        stored.last_used = self._clock()
        self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str, owner: Owner) -> bool:
        """Remove ``owner``'s stored response; ``False`` if unknown."""
        stored = self.get(response_id, owner)
        if stored is None:
            return False
        self._drop(stored)
        return True

    def item(self, owner: Owner) -> Callable[[str], Mapping[str, Any] | None]:
        """A lookup of ``owner``'s stored items by id (for ``item_reference``), the newest response
        holding it first. Each lookup is a few dictionary reads, safe from a worker thread while
        the event loop stores and drops responses; one that expired meanwhile is not found."""
        self._expire()

        def find(item_id: str) -> Mapping[str, Any] | None:
            now = self._clock()
            for response_id in reversed(list(self._index.get((owner, item_id), ()))):
                stored = self._items.get(response_id)
                if stored is not None and stored.owner == owner and not self._expired(stored, now):
                    return stored.items.get(item_id)
            return None

        return find
