"""Least recently used: evict the key whose last put or hit is oldest."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvstore.policy.base import Policy
from kvstore.types import BlockKey


class LRUPolicy(Policy):
    """LRU over one ``OrderedDict`` (oldest first), O(1) per event.

    ``victims`` walks from the oldest end and costs O(n + pinned keys it passes).
    """

    name = "lru"

    def __init__(self) -> None:
        # Order is recency: first = least recently used. Values are unused.
        self._order: OrderedDict[BlockKey, None] = OrderedDict()

    def on_put(self, key: BlockKey, size: int) -> None:
        # A put of a tracked key is an access, so it moves to the newest end either way.
        self._order[key] = None
        self._order.move_to_end(key)

    def on_hit(self, key: BlockKey) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: BlockKey) -> None:
        self._order.pop(key, None)

    def on_put_many(self, keys: Sequence[BlockKey], sizes: Sequence[int]) -> None:
        order = self._order
        for key in keys:
            order[key] = None
            order.move_to_end(key)

    def on_hit_many(self, keys: Sequence[BlockKey]) -> None:
        order = self._order
        for key in keys:
            if key in order:
                order.move_to_end(key)

    def on_remove_many(self, keys: Sequence[BlockKey]) -> None:
        pop = self._order.pop
        for key in keys:
            pop(key, None)

    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        out: list[BlockKey] = []
        if n <= 0:
            return out
        for key in self._order:  # no mutation while iterating: victims are only named
            if evictable(key):
                out.append(key)
                if len(out) == n:
                    break
        return out

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order
