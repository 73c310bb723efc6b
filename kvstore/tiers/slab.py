"""Fixed-size slot slab shared by the memory tiers (host RAM, device memory).

One preallocated buffer of ``num_slots * slot_bytes`` bytes. A block of ``n`` bytes takes
``ceil(n / slot_bytes)`` slots, not necessarily contiguous; its bytes are laid out across its
slots in order, so a block is a list of *extents* ``(byte offset in slab, length)`` with
adjacent slots merged.

The free list is a numpy int64 stack (``_free[:_nfree]``); allocation pops a slice off its top
(sorted) and freeing pushes a block's slots back, so the put path creates no Python object per
slot. The stack starts as ``num_slots-1 .. 0``, so a fresh slab hands out ascending contiguous
runs, and a block of n slots freed and followed by an allocation of n slots gets the same run
back. This is a stack, not a best-fit allocator: after churn of mixed sizes a block may span
several runs, which costs one extent each and nothing else.

Two-phase writes (the store's zero-copy shared-memory path): :meth:`SlabTier.reserve` allocates
and charges slots for a key that stays invisible, a client writes the bytes at the returned
extents, then :meth:`SlabTier.publish` makes the key visible (replacing any stored copy) or
:meth:`SlabTier.unreserve` frees the slots.

Locking: ``_lock`` guards the free list, the index and the reservations. Byte copies run
outside it: the store never touches one key from two threads at once, and a key's slots cannot
be freed or reused while it is reserved or stored, so a copy never races with a reallocation.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.errors import CapacityError
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.types import BlockKey

Extents = list[tuple[int, int]]


class SlabInfo(NamedTuple):
    """Where a slab lives: the shared-memory name a local client maps (None when the slab is
    not shareable, e.g. device memory), its size in bytes and its slot size."""

    shm_name: str | None
    size: int
    slot_bytes: int


class _Entry(NamedTuple):
    slots: np.ndarray  # int64 slot numbers, in block byte order
    size: int  # payload bytes (<= len(slots) * slot_bytes)
    extents: Extents  # computed once at allocation: reads then touch no numpy scalars


class SlabTier(Tier):
    """A memory tier over one slab of fixed-size slots. Subclasses allocate the slab and copy
    bytes in and out of it at byte extents."""

    def __init__(self, capacity_bytes: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> None:
        super().__init__(capacity_bytes)
        if slot_bytes <= 0:
            raise ValueError(f"{self.name} tier slot_bytes must be positive, got {slot_bytes}")
        self.slot_bytes = int(slot_bytes)
        self.num_slots = self.capacity_bytes // self.slot_bytes
        if self.num_slots == 0:
            raise ValueError(
                f"{self.name} tier capacity {capacity_bytes} is smaller than one slot "
                f"({slot_bytes} bytes)"
            )
        self.slab_bytes = self.num_slots * self.slot_bytes
        self._free = np.arange(self.num_slots - 1, -1, -1, dtype=np.int64)
        self._nfree = self.num_slots
        self._index: dict[BlockKey, _Entry] = {}
        self._reserved: dict[BlockKey, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- subclass hooks -----------------------------------------------------------------
    @abstractmethod
    def _copy_in(self, extents: Extents, data: memoryview) -> None:
        """Write ``data`` (bytes, ``len == sum of lengths``) at the extents, in order."""

    @abstractmethod
    def _copy_out(self, extents: Extents, size: int) -> bytes:
        """A fresh ``bytes`` of the slab at the extents, concatenated."""

    @abstractmethod
    def slab_info(self) -> SlabInfo:
        """Where the slab lives, for zero-copy clients."""

    # -- accounting ---------------------------------------------------------------------
    def used_bytes(self) -> int:
        return (self.num_slots - self._nfree) * self.slot_bytes

    def charge(self, size: int) -> int:
        return self._nslots(size) * self.slot_bytes

    def _nslots(self, size: int) -> int:
        if size < 0:
            raise ValueError(f"block size must be non-negative, got {size}")
        return -(-size // self.slot_bytes)

    # -- slot allocation (caller holds _lock) ---------------------------------------------
    def _pop(self, n: int) -> np.ndarray:
        # Sorted, so that whatever runs of neighbours the top of the stack holds merge into as
        # few extents as possible (np.sort also copies the slots out of the stack).
        top = self._nfree
        self._nfree = top - n
        return np.sort(self._free[top - n : top])

    def _push(self, slots: np.ndarray) -> None:
        n = len(slots)
        self._free[self._nfree : self._nfree + n] = slots[::-1]
        self._nfree += n

    def _entry(self, slots: np.ndarray, size: int, first: int, last: int) -> _Entry:
        """The entry of a block on sorted ``slots``; ``first``/``last`` are its first and last
        slot as Python ints (callers get them for a whole batch from one ``tolist``)."""
        n = len(slots)
        if n == 0:
            return _Entry(slots, size, [])
        if last - first == n - 1:  # one contiguous run: the common case
            return _Entry(slots, size, [(first * self.slot_bytes, size)])
        return _Entry(slots, size, self._runs(slots, size))

    def _runs(self, slots: np.ndarray, size: int) -> Extents:
        sb = self.slot_bytes
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [len(slots)]))
        out = [(int(slots[s]) * sb, int(e - s) * sb) for s, e in zip(starts, ends, strict=True)]
        last_off, last_len = out[-1]
        out[-1] = (last_off, last_len - (len(slots) * sb - size))  # trim the last slot's tail
        return out

    # -- two-phase writes -----------------------------------------------------------------
    def reserve(self, key: BlockKey, size: int) -> Extents:
        """Allocate and charge slots for ``key`` without making it visible; returns the
        extents to write the block's bytes at, in block order. A stored copy of ``key`` stays
        visible until :meth:`publish`. Raises :class:`CapacityError` when too few slots are
        free and ``ValueError`` if ``key`` is already reserved."""
        n = self._nslots(size)
        with self._lock:
            self._check_open()
            if key in self._reserved:
                raise ValueError(f"{key!r} is already reserved")
            if n > self._nfree:
                raise CapacityError(
                    f"{self.name} tier: {n} slots needed, {self._nfree} free of {self.num_slots}"
                )
            slots = self._pop(n)
            entry = self._entry(slots, size, *(slots[[0, -1]].tolist() if n else (0, 0)))
            self._reserved[key] = entry
        return list(entry.extents)

    def publish(self, key: BlockKey) -> None:
        """Make a reserved key visible, freeing the slots of any copy it replaces. Raises
        ``KeyError`` if ``key`` is not reserved."""
        with self._lock:
            entry = self._reserved.pop(key)
            old = self._index.get(key)
            if old is not None:
                self._push(old.slots)
            self._index[key] = entry

    def unreserve(self, key: BlockKey) -> None:
        """Free a reservation; a key that is not reserved is ignored (abort is idempotent)."""
        with self._lock:
            entry = self._reserved.pop(key, None)
            if entry is not None:
                self._push(entry.slots)

    # -- reads of stored keys ---------------------------------------------------------------
    def extents(self, key: BlockKey) -> Extents:
        """Extents of a stored key, valid until it is deleted or overwritten (the store pins
        it meanwhile). Raises ``KeyError`` if absent."""
        with self._lock:
            entry = self._index[key]
        return list(entry.extents)

    def read(self, key: BlockKey) -> bytes:
        """The bytes of a stored key (one copy). Raises ``KeyError`` if absent."""
        with self._lock:
            entry = self._index[key]
        return self._copy_out(entry.extents, entry.size)

    # -- Tier -------------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        views: dict[BlockKey, memoryview] = {}
        for key, buf, _meta in items:  # a key given twice: the last copy wins
            views[key] = memoryview(buf).cast("B")
        keys = list(views)
        sizes = [v.nbytes for v in views.values()]
        counts = [self._nslots(n) for n in sizes]
        with self._lock:
            self._check_open()
            busy = [k for k in keys if k in self._reserved]
            if busy:
                raise ValueError(f"{self.name} tier: keys reserved by a writer: {busy[:3]!r}")
            olds = [self._index.get(k) for k in keys]
            needed = sum(counts)
            free = self._nfree + sum(len(o.slots) for o in olds if o is not None)
            if needed > free:
                raise CapacityError(
                    f"{self.name} tier: {needed} slots needed, {free} available of {self.num_slots}"
                )
            # Overwritten keys disappear first so that both copies never need room at once
            # (the store does not read a key it is writing); then one pop for the whole batch.
            replaced = [
                self._index.pop(k).slots for k, o in zip(keys, olds, strict=True) if o is not None
            ]
            if replaced:
                self._push(np.concatenate(replaced))
            slots = self._pop(needed)
            ints = slots.tolist()
            entries, at = [], 0
            for n, size in zip(counts, sizes, strict=True):
                first, last = (ints[at], ints[at + n - 1]) if n else (0, 0)
                entries.append(self._entry(slots[at : at + n], size, first, last))
                at += n
            self._reserved.update(zip(keys, entries, strict=True))  # charged, invisible
        try:
            for entry, view in zip(entries, views.values(), strict=True):
                self._copy_in(entry.extents, view)
        except BaseException:
            for key in keys:
                self.unreserve(key)
            raise
        with self._lock:
            for key, entry in zip(keys, entries, strict=True):
                del self._reserved[key]
                self._index[key] = entry

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        with self._lock:
            entries = [self._index.get(k) for k in keys]
        return [None if e is None else self._copy_out(e.extents, e.size) for e in entries]

    def contains(self, key: BlockKey) -> bool:
        return key in self._index

    def delete(self, keys: Sequence[BlockKey]) -> None:
        with self._lock:
            for key in keys:
                entry = self._index.pop(key, None)
                if entry is not None:
                    self._push(entry.slots)

    def __len__(self) -> int:
        return len(self._index)

    def health(self) -> dict[str, object]:
        return {
            "ok": not self._closed,
            "slots": self.num_slots,
            "free_slots": self._nfree,
            "blocks": len(self._index),
            "reserved": len(self._reserved),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} tier is closed")
