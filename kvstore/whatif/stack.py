"""LRU stack distances in bytes: for each access to a tracked key, the bytes of the distinct
other keys accessed since its previous access (an LRU cache of capacity ``C`` hits it exactly
when that plus its own size is at most ``C``), in O(log n) per access.

A Fenwick tree over access positions holds each key's size at the position of its latest
access and zero elsewhere, so the bytes accessed since position ``p`` are the total minus the
prefix sum up to ``p`` (Bennett and Kruskal's counting, as SHARDS does with a balanced tree).
Positions only grow; when they reach the tree's end, the live keys are renumbered 1..n in
order and the tree rebuilt with whole-array numpy steps (O(n), after at least n accesses, so
O(1) amortized and never a Python loop per key). Keys are integer slots the caller allocates.

Memory: 16 bytes per slot (position, size; the slot arrays grow by an eighth) and 8 per tree
node; the tree has two to four times as many nodes as live keys (once past 1,024), so 32 to
50 bytes per tracked key.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

_MIN_NODES = 1024


class ReuseStack:
    """Last-access positions of slots and the bytes after each. Not thread-safe."""

    __slots__ = ("_clock", "_n", "_pos", "_size", "_total", "_tree", "live")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._n = _MIN_NODES  # tree nodes (positions 1.._n)
        self._tree = array("q", bytes(8 * (self._n + 1)))
        self._pos = array("q")  # slot -> position of its latest access (0: not live)
        self._size = array("q")  # slot -> its size at that access
        self._clock = 0  # the last position given
        self._total = 0  # bytes of every live slot
        self.live = 0

    def touch(self, slot: int, size: int) -> int | None:
        """Access ``slot`` with ``size`` bytes now; the bytes of the other live slots accessed
        since its previous access, or None if it was not live (a first access)."""
        if self._clock == self._n:
            self._compact()
        if slot >= len(self._pos):  # slots come dense from the caller: grow by an eighth
            grow = max(slot + 1 - len(self._pos), len(self._pos) // 8 + 64)
            self._pos.extend(array("q", bytes(8 * grow)))
            self._size.extend(array("q", bytes(8 * grow)))
        tree, n = self._tree, self._n
        last = self._pos[slot]
        since: int | None = None
        if last:
            old = self._size[slot]
            # bytes at positions after ``last``: total minus the prefix sum through it
            i, head = last, 0
            while i:
                head += tree[i]
                i &= i - 1
            since = self._total - head
            i = last
            while i <= n:
                tree[i] -= old
                i += i & -i
            self._total -= old
        else:
            self.live += 1
        self._clock += 1
        i = self._clock
        self._pos[slot], self._size[slot] = i, size
        while i <= n:
            tree[i] += size
            i += i & -i
        self._total += size
        return since

    def remove(self, slots: Iterable[int]) -> None:
        """Forget ``slots`` (those not live are ignored); their bytes leave every distance."""
        tree, n, pos, sizes = self._tree, self._n, self._pos, self._size
        for slot in slots:
            if slot >= len(pos) or not pos[slot]:
                continue
            i, size = pos[slot], sizes[slot]
            while i <= n:
                tree[i] -= size
                i += i & -i
            pos[slot] = 0
            self._total -= size
            self.live -= 1

    def nbytes(self) -> int:
        return 8 * (len(self._tree) + len(self._pos) + len(self._size))

    def _compact(self) -> None:
        """Renumber the live slots 1..live in access order and rebuild the tree, at least
        twice as large as ``live`` so that as many accesses again fit before the next time."""
        pos = np.frombuffer(self._pos, dtype=np.int64)
        size = np.frombuffer(self._size, dtype=np.int64)
        slots = np.flatnonzero(pos)
        slots = slots[np.argsort(pos[slots], kind="stable")]
        live = len(slots)
        n = _MIN_NODES
        while n < 2 * live:
            n *= 2
        values = np.zeros(n + 1, dtype=np.int64)
        values[1:live + 1] = size[slots]
        prefix = np.cumsum(values)
        # Fenwick node i covers positions (i - lowbit(i), i]: a difference of prefix sums
        node = np.arange(n + 1, dtype=np.int64)
        tree = prefix - prefix[node - (node & -node)]
        tree[0] = 0
        new_pos = pos.copy()
        new_pos[slots] = np.arange(1, live + 1, dtype=np.int64)
        del pos, size  # the views must go before the arrays they view are replaced
        self._pos = array("q", new_pos.tobytes())
        self._tree = array("q", tree.tobytes())
        self._n, self._clock = n, live
