"""The store's ghost record: the last blocks to leave the store, each with when, from which
tier and why, so that "why did this miss?" can tell an evicted block from one never stored.

Bounded: at most ``capacity`` keys (oldest departure forgotten first), a few hundred bytes
each; 0 keeps none. Only departures from the store are recorded (a block demoted to a lower
tier has not left), so nothing is added on a put that does not evict from the last tier, and
a departure costs one dict insertion. A block stored again keeps its ghost until it is pushed
out: the index is asked first, so a stale ghost is never reported. Not thread-safe: the store
calls it under its lock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from kvstore.types import BlockKey, Ghost, LeftBecause


class Ghosts:
    """``BlockKey -> Ghost`` for the most recent ``capacity`` departures."""

    __slots__ = ("_by_key", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"ghost capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._by_key: OrderedDict[BlockKey, Ghost] = OrderedDict()

    def record(self, keys: Iterable[BlockKey], tier: str, why: LeftBecause) -> None:
        """``keys`` left the store from ``tier`` now, because ``why``; the oldest ghosts beyond
        the capacity are forgotten."""
        if not self.capacity:
            return
        ghost = Ghost(time.time(), tier, why)  # one value shared by the whole batch
        by_key = self._by_key
        for key in keys:
            by_key[key] = ghost
            by_key.move_to_end(key)
        while len(by_key) > self.capacity:
            by_key.popitem(last=False)

    def get(self, key: BlockKey) -> Ghost | None:
        return self._by_key.get(key)

    def forget_namespace(self, namespace: str) -> None:
        """Drop the ghosts of a deleted namespace (its blocks are not worth remembering, and
        they would push out other namespaces' ghosts)."""
        for key in [k for k in self._by_key if k[0] == namespace]:
            del self._by_key[key]

    def __len__(self) -> int:
        return len(self._by_key)
