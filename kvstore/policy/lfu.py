"""Least frequently used with dynamic aging (LFU-DA, Arlitt et al. 2000).

Each resident key has a priority ``age + frequency``, where ``age`` is a global offset that
rises to the priority of the keys the policy names as victims. A key that was hot long ago keeps
its old priority while new keys enter at the current age and overtake it, so past popularity
decays without ever rewriting every count. Equal priorities go to the least recently touched key.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.policy.base import Policy
from kvstore.types import BlockKey

_COMPACT_SLACK = 64
"""Stale heap entries tolerated beyond one per resident key before the heap is rebuilt."""


@dataclass(slots=True)
class _Entry:
    freq: int
    priority: int
    seq: int  # recency stamp of the last put or hit; identifies the one live heap entry


class LFUPolicy(Policy):
    """LFU-DA over a binary heap with lazy invalidation.

    Every put or hit pushes a fresh ``(priority, seq, key)`` entry and leaves the old one stale;
    stale entries are skipped when popped and the heap is rebuilt once they outnumber live ones,
    so events cost O(log n) amortized and memory stays O(resident keys).

    ``max_freq`` caps a key's count so that one very hot burst cannot pin a key for ever; with
    aging alone the cap is not needed for correctness, only to bound how long it takes.
    """

    name = "lfu"

    def __init__(self, max_freq: int = 1 << 16) -> None:
        if max_freq < 1:
            raise ValueError(f"max_freq must be >= 1, got {max_freq}")
        self.max_freq = max_freq
        self._age = 0
        self._entries: dict[BlockKey, _Entry] = {}
        self._heap: list[tuple[int, int, BlockKey]] = []
        self._clock = itertools.count()

    def on_put(self, key: BlockKey, size: int) -> None:
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = entry = _Entry(freq=0, priority=0, seq=0)
        self._touch(key, entry)

    def on_hit(self, key: BlockKey) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            self._touch(key, entry)

    def on_remove(self, key: BlockKey) -> None:
        # The heap entry goes stale; it is dropped when popped or at the next rebuild.
        if self._entries.pop(key, None) is not None:
            self._maybe_compact()

    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        out: list[BlockKey] = []
        popped: list[tuple[int, int, BlockKey]] = []
        heap, entries = self._heap, self._entries
        while len(out) < n and heap:
            item = heapq.heappop(heap)
            _, seq, key = item
            entry = entries.get(key)
            if entry is None or entry.seq != seq:
                continue  # stale: the key was touched again or removed since this push
            popped.append(item)
            if evictable(key):
                out.append(key)
        # Victims are not forgotten until on_remove, and pinned keys keep their place: every
        # live entry popped goes back unchanged.
        for item in popped:
            heapq.heappush(heap, item)
        if out:
            # The age rises to the priority of the last key named, as if those were evicted;
            # keys entering from now on start above every victim, which is what ages old counts.
            self._age = max(self._age, entries[out[-1]].priority)
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def _touch(self, key: BlockKey, entry: _Entry) -> None:
        entry.freq = min(entry.freq + 1, self.max_freq)
        entry.priority = self._age + entry.freq
        entry.seq = next(self._clock)
        heapq.heappush(self._heap, (entry.priority, entry.seq, key))
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        # Rebuilding costs O(n) and happens only after about n stale pushes: O(1) amortized.
        if len(self._heap) > 2 * len(self._entries) + _COMPACT_SLACK:
            self._heap = [(e.priority, e.seq, k) for k, e in self._entries.items()]
            heapq.heapify(self._heap)
