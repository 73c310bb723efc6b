"""The keys a tracker follows: each sampled block's 64-bit fingerprint, mapped to an integer
slot, and per slot its sample value, namespace and request count, in flat arrays so that
lowering the rate or dropping a namespace finds its keys with whole-array numpy steps.

Memory per key: one dict entry with two ints (about 110 bytes on CPython 3.11; the map is
rebuilt after removals, which would leave it larger) and 32 bytes of slot arrays (more while
freed slots wait for reuse).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np


class TrackedKeys:
    """``fingerprint -> slot``, with each slot's sample value, namespace index (-1: a free
    slot) and request count. Not thread-safe."""

    __slots__ = ("_count", "_fp", "_free", "_space", "_value", "slot_of")

    def __init__(self) -> None:
        self.slot_of: dict[int, int] = {}
        self._fp = array("Q")
        self._value = array("Q")
        self._space = array("q")
        self._count = array("q")
        self._free: list[int] = []

    def add(self, fp: int, value: int, space: int) -> int:
        """A new key; its slot."""
        if self._free:
            slot = self._free.pop()
            self._fp[slot], self._value[slot], self._space[slot] = fp, value, space
            self._count[slot] = 0
        else:
            slot = len(self._fp)
            self._fp.append(fp)
            self._value.append(value)
            self._space.append(space)
            self._count.append(0)
        self.slot_of[fp] = slot
        return slot

    def requested(self, slot: int) -> int:
        """Count a request for the key in ``slot``; how many it has had, this one included."""
        count = self._count[slot] + 1
        self._count[slot] = count
        return count

    def remove(self, slots: Iterable[int]) -> list[int]:
        """Forget the keys in ``slots``; their fingerprints."""
        out = []
        for slot in slots:
            fp = self._fp[slot]
            del self.slot_of[fp]
            self._space[slot] = -1
            self._free.append(slot)
            out.append(fp)
        return out

    def compact(self) -> None:
        """Rebuild the map after many removals: a dict keeps the room of the keys it lost
        (about 40 bytes per key more after a fixed-size tracker's churn)."""
        self.slot_of = dict(self.slot_of)

    def limit_keeping(self, keep: int) -> int:
        """The smallest sample value such that at most ``keep`` keys lie below it: lowering the
        sampling limit to it drops the keys of the largest values, as fixed-size SHARDS does."""
        values = self._live_values()
        if keep >= len(values):
            return 1 << 64
        return int(np.partition(values, keep)[keep])

    def at_or_above(self, limit: int) -> list[int]:
        """Slots of the keys whose sample value is at least ``limit``."""
        live = np.frombuffer(self._space, dtype=np.int64) >= 0
        value = np.frombuffer(self._value, dtype=np.uint64)
        return np.flatnonzero(live & (value >= np.uint64(limit))).tolist()

    def of_space(self, space: int) -> list[int]:
        """Slots of the keys of namespace index ``space``."""
        return np.flatnonzero(np.frombuffer(self._space, dtype=np.int64) == space).tolist()

    def __len__(self) -> int:
        return len(self.slot_of)

    def nbytes(self) -> int:
        """Bytes of the slot arrays (the dict is counted by the caller's estimate)."""
        return 8 * (len(self._fp) + len(self._value) + len(self._space) + len(self._count)
                    + len(self._free))

    def _live_values(self) -> np.ndarray:
        live = np.frombuffer(self._space, dtype=np.int64) >= 0
        return np.frombuffer(self._value, dtype=np.uint64)[live]
