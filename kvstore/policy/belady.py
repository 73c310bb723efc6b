"""Belady's MIN: the offline optimum that benchmarks and tests measure policies against.

Not a :class:`~kvstore.policy.base.Policy`: it needs the whole future of the trace. On a miss
with the cache full it evicts the resident key whose next access is furthest away (or never).
Like the online policies here it must insert every missed key (demand fetch, no bypass), so its
hit count is the best any of them can reach on the same trace and capacity.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

_NEVER = 1 << 62  # next-use position of a key that is not accessed again


def next_use(trace: Sequence[Hashable]) -> list[int]:
    """``out[i]`` is the position of the next access to ``trace[i]``, or a large sentinel."""
    out = [_NEVER] * len(trace)
    last: dict[Hashable, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        key = trace[i]
        out[i] = last.get(key, _NEVER)
        last[key] = i
    return out


def belady_hits(trace: Sequence[Hashable], capacity: int) -> int:
    """Number of hits MIN gets on ``trace`` with room for ``capacity`` keys. O(len log cap)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    nxt = next_use(trace)
    resident: dict[Hashable, int] = {}  # key -> position of its next access
    # Max-heap on next use via negation; an entry is live while it matches ``resident``.
    heap: list[tuple[int, int]] = []
    hits = 0
    for i, key in enumerate(trace):
        if key in resident:
            hits += 1
        elif len(resident) >= capacity:
            while True:
                neg_next, pos = heapq.heappop(heap)
                victim = trace[pos]
                if resident.get(victim) == -neg_next:
                    del resident[victim]
                    break
        resident[key] = nxt[i]
        # ``pos`` names the key through the trace, so entries need no comparable keys.
        heapq.heappush(heap, (-nxt[i], i))
    return hits
