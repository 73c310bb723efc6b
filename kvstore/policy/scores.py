"""A compact map from block keys to eviction scores: two flat 64-bit arrays, open addressing.

The sampled policies (:mod:`kvstore.policy.sampled`) keep one score per block they were told
about in this table instead of a Python object per block: 16 bytes per slot, at most 70% of
slots full, so 23 to 46 bytes per block. A key is reduced to a 64-bit fingerprint, Python's own
hash of the key tuple (SipHash of the block hash, cached in the bytes object, mixed with the
namespace's): the table lives only as long as the process, so the per-process seed does not
matter. Two keys with the same fingerprint share a score, which costs eviction quality for
those two blocks and nothing else (2^-64 per pair of keys).

Linear probing with backward-shift deletion, so there are no tombstones and a lookup ends at
the first empty slot. The slots are ``array.array`` (one C read per probe, no numpy scalar);
growth re-places every key with whole-array numpy rounds, never a Python loop per key.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from kvstore.types import BlockKey

_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: the slot is the top bits of fp * golden
_M64 = (1 << 64) - 1
_MAX_LOAD = 0.7
_MIN_BITS = 10


class ScoreTable:
    """``fingerprint(key) -> score`` (an unsigned 64-bit integer). Not thread-safe: the owning
    policy runs under the store lock."""

    __slots__ = ("_bits", "_fps", "_len", "_mask", "_shift", "_vals")

    def __init__(self, expected: int = 0) -> None:
        bits = _MIN_BITS
        while (1 << bits) * _MAX_LOAD < expected:
            bits += 1
        self._len = 0
        self._resize_empty(bits)

    def _resize_empty(self, bits: int) -> None:
        self._bits = bits
        self._shift = 64 - bits
        self._mask = (1 << bits) - 1
        self._fps = array("Q", bytes(8 << bits))  # 0 = empty slot
        self._vals = array("Q", bytes(8 << bits))

    # -- keys ---------------------------------------------------------------------------------
    @staticmethod
    def fingerprint(key: object) -> int:
        """The key's 64-bit fingerprint (never 0, which marks an empty slot)."""
        return hash(key) & _M64 or 1

    def _find(self, key: object) -> tuple[int, int]:
        """(slot, fingerprint): the key's slot, or the empty slot where it would go."""
        return self._find_fp(hash(key) & _M64 or 1)

    def _find_fp(self, fp: int) -> tuple[int, int]:
        fps, mask = self._fps, self._mask
        i = ((fp * _GOLDEN) & _M64) >> self._shift
        while True:
            f = fps[i]
            if f == fp or f == 0:
                return i, fp
            i = (i + 1) & mask

    # -- reading ------------------------------------------------------------------------------
    def get(self, key: BlockKey, default: int = 0) -> int:
        i, fp = self._find(key)
        return self._vals[i] if self._fps[i] == fp else default

    def get_many(self, keys: Iterable[BlockKey], default: int = 0) -> list[int]:
        """:meth:`get` of each key."""
        get = self.get
        return [get(key, default) for key in keys]

    def __contains__(self, key: object) -> bool:
        i, fp = self._find(key)
        return self._fps[i] == fp

    def __len__(self) -> int:
        return self._len

    def nbytes(self) -> int:
        """Bytes of the two slot arrays (what the table costs, whatever it holds)."""
        return 16 << self._bits

    # -- changing -----------------------------------------------------------------------------
    def set(self, key: BlockKey, value: int) -> None:
        i, fp = self._find(key)
        self._vals[i] = value
        if self._fps[i] == fp:
            return
        self._fps[i] = fp
        self._len += 1
        if self._len > _MAX_LOAD * (self._mask + 1):
            self._grow()

    def set_many(self, keys: Iterable[BlockKey], values: Iterable[int]) -> None:
        """:meth:`set` of each key to its value, in order (a key given twice: the last)."""
        put = self.set
        for key, value in zip(keys, values, strict=True):
            put(key, value)

    def get_fingerprint(self, fp: int, default: int = 0) -> int:
        """:meth:`get` by fingerprint (what :meth:`fingerprint` returned for a key)."""
        i, fp = self._find_fp(fp)
        return self._vals[i] if self._fps[i] == fp else default

    def pop(self, key: BlockKey) -> None:
        """Forget ``key`` (absent keys are ignored)."""
        self.pop_fingerprint(hash(key) & _M64 or 1)

    def pop_many(self, keys: Iterable[BlockKey]) -> None:
        """:meth:`pop` of each key."""
        pop = self.pop_fingerprint
        for key in keys:
            pop(hash(key) & _M64 or 1)

    def pop_fingerprint(self, fp: int) -> None:
        """:meth:`pop` by fingerprint."""
        i, fp = self._find_fp(fp)
        fps, vals, mask, shift = self._fps, self._vals, self._mask, self._shift
        if fps[i] != fp:
            return
        # Backward shift: pull later keys of the run into the hole when the hole lies on
        # their probe path (between their home and their slot), so lookups never need
        # tombstones.
        hole = i
        j = (i + 1) & mask
        while (f := fps[j]) != 0:
            home = ((f * _GOLDEN) & _M64) >> shift
            if (j - home) & mask >= (j - hole) & mask:
                fps[hole], vals[hole] = f, vals[j]
                hole = j
            j = (j + 1) & mask
        fps[hole] = 0
        vals[hole] = 0
        self._len -= 1

    def clear(self) -> None:
        self._len = 0
        self._resize_empty(_MIN_BITS)

    def _grow(self) -> None:
        """Double the slots and re-place every key, a numpy round per probe step: each round
        places, for every slot wanted, the first key that wants it; the others move one slot
        on. A key only moves past slots that are then full, which is linear probing's
        invariant."""
        old_f = np.frombuffer(self._fps, dtype=np.uint64)
        old_v = np.frombuffer(self._vals, dtype=np.uint64)
        live = old_f != 0
        fps, vals = old_f[live], old_v[live]
        self._resize_empty(self._bits + 1)
        new_f = np.zeros(1 << self._bits, dtype=np.uint64)
        new_v = np.zeros(1 << self._bits, dtype=np.uint64)
        mask = np.uint64(self._mask)
        with np.errstate(over="ignore"):
            slots = (fps * np.uint64(_GOLDEN)) >> np.uint64(self._shift)
        todo = np.arange(len(fps))
        while todo.size:
            s = slots[todo]
            free = new_f[s] == 0
            want, at = todo[free], s[free]
            taken, first = np.unique(at, return_index=True)
            new_f[taken] = fps[want[first]]
            new_v[taken] = vals[want[first]]
            placed = np.zeros(len(fps), dtype=bool)
            placed[want[first]] = True
            todo = todo[~placed[todo]]
            slots[todo] = (slots[todo] + np.uint64(1)) & mask
        self._fps = array("Q", new_f.tobytes())
        self._vals = array("Q", new_v.tobytes())
