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

Two-phase writes (the store's zero-copy shared-memory path): :meth:`SlabTier.reserve` (or
``reserve_many`` for a batch) allocates and charges slots for a key that stays invisible, a
client writes the bytes at the returned extents, then :meth:`SlabTier.publish` (``publish_many``)
makes the key visible, replacing any stored copy, or :meth:`SlabTier.unreserve` frees the
slots. ``put_many`` is the same three steps with the copy done here.

Locking: ``_lock`` guards the free list, the index and the reservations. Byte copies run
outside it: the store never touches one key from two threads at once, and a key's slots cannot
be freed or reused while it is reserved or stored, so a copy never races with a reallocation.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Iterable, Sequence
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


# A block's entry: (size, extents). The extents, computed once at allocation, are all a block
# keeps: its slots are ``off // slot_bytes`` onwards for each extent, rebuilt with numpy for a
# whole batch when freed. Reads touch no numpy at all. A plain tuple, no per-block numpy slice:
# on this path each costs a fair part of a 64 KiB memcpy.
_Entry = tuple[int, Extents]
_PLAIN = (bytes, bytearray)  # buffers put_many copies without a memoryview


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
        self._desc = np.arange(self.num_slots - 1, -1, -1, dtype=np.int64)
        self._free = self._desc.copy()
        self._nfree = self.num_slots
        self._index: dict[BlockKey, _Entry] = {}
        self._reserved: dict[BlockKey, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- subclass hooks -----------------------------------------------------------------
    @abstractmethod
    def _copy_in(self, extents: Extents, data: Buffer) -> None:
        """Write ``data`` (bytes, bytearray or a flat byte memoryview whose length is the sum
        of the extent lengths) at the extents, in order."""

    def _copy_in_many(self, extents: list[Extents], datas: list[Buffer]) -> None:
        """:meth:`_copy_in` for a batch; subclasses may override it with a tighter loop."""
        for ext, data in zip(extents, datas, strict=True):
            self._copy_in(ext, data)

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
        return self._nslots(self._check_size(size)) * self.slot_bytes

    def _nslots(self, size: int) -> int:
        return -(-size // self.slot_bytes)

    def _check_size(self, size: int) -> int:
        if size < 0:
            raise ValueError(f"block size must be non-negative, got {size}")
        return int(size)

    def _check_room(self, needed: int, available: int) -> None:
        if needed > available:
            raise CapacityError(
                f"{self.name} tier: {needed} slots needed, {available} available of "
                f"{self.num_slots}"
            )

    # -- slot allocation (caller holds _lock) ---------------------------------------------
    def _pop(self, n: int) -> list[int]:
        """Take ``n`` slots off the stack, sorted so that whatever runs of neighbours they hold
        merge into as few extents as possible. A temporary list of ints: the caller turns it
        into a block's extents at once, and plain ints beat numpy scalars there."""
        top = self._nfree
        self._nfree = top - n
        taken = self._free[top - n : top]
        return sorted(taken.tolist()) if n <= 128 else np.sort(taken).tolist()

    def _release(self, entries: Iterable[_Entry]) -> None:
        """Push the slots of ``entries`` back on the free list, lowest slot of each run on
        top. A run's slots are copied from a slice of ``_desc`` (every slot number,
        descending), so freeing makes no array and no Python int per slot."""
        sb, free, desc, last = self.slot_bytes, self._free, self._desc, self.num_slots - 1
        runs = [run for _size, extents in entries for run in extents]
        if not runs:
            return
        ns = [-(-length // sb) for _, length in runs]
        top = self._nfree
        if max(ns) == 1:  # one slot per run (64 KiB blocks): all back in one assignment
            singles = [off // sb for off, _ in reversed(runs)]
            free[top : top + len(singles)] = singles
            self._nfree = top + len(singles)
            return
        for (off, _length), n in zip(runs, ns, strict=True):
            first = off // sb  # desc[last - first - n + 1 : last - first + 1] is first+n-1..first
            free[top : top + n] = desc[last - first - n + 1 : last - first + 1]
            top += n
        self._nfree = top

    def _alloc(self, sizes: list[int], counts: list[int]) -> list[_Entry]:
        """Entries for blocks of ``sizes`` taking ``counts`` slots, from one pop. Caller holds
        ``_lock`` and checked that enough slots are free."""
        sb = self.slot_bytes
        slots = self._pop(sum(counts))
        if len(slots) == len(sizes) and all(counts):  # one slot per block: the 64 KiB case
            return [(size, [(slot * sb, size)]) for slot, size in zip(slots, sizes, strict=True)]
        entries: list[_Entry] = []
        at = 0
        for n, size in zip(counts, sizes, strict=True):
            if n and slots[at + n - 1] - slots[at] == n - 1:  # one contiguous run: common case
                entries.append((size, [(slots[at] * sb, size)]))
            else:
                entries.append((size, self._runs(slots[at : at + n], size) if n else []))
            at += n
        return entries

    def _runs(self, slots: list[int], size: int) -> Extents:
        """Extents of a block over sorted, not all adjacent ``slots``: one per run of
        neighbours, the last one trimmed to the block's size."""
        sb = self.slot_bytes
        out: Extents = []
        start = prev = slots[0]
        for slot in slots[1:]:
            if slot != prev + 1:
                out.append((start * sb, (prev - start + 1) * sb))
                start = slot
            prev = slot
        out.append((start * sb, size - sum(n for _, n in out)))
        return out

    # -- two-phase writes -----------------------------------------------------------------
    def reserve(self, key: BlockKey, size: int) -> Extents:
        """Allocate and charge slots for ``key`` without making it visible; returns the
        extents to write the block's bytes at, in block order. A stored copy of ``key`` stays
        visible until :meth:`publish`. Raises :class:`CapacityError` when too few slots are
        free and ``ValueError`` if ``key`` is already reserved."""
        return self.reserve_many([(key, size)])[0]

    def reserve_many(self, items: Sequence[tuple[BlockKey, int]]) -> list[Extents]:
        """:meth:`reserve` for a batch of ``(key, size)``, all or nothing, in one lock hold."""
        # Comprehensions and two dict operations per key (tuple keys rehash on every lookup):
        # this runs once per shared-memory write batch, against a memcpy of the batch.
        keys = [k for k, _ in items]
        sizes = [int(n) for _, n in items]
        if sizes and min(sizes) < 0:
            raise ValueError(f"block size must be non-negative, got {min(sizes)}")
        sb = self.slot_bytes
        counts = [-(-n // sb) for n in sizes]
        with self._lock:
            self._check_open()
            reserved = self._reserved
            if not reserved.keys().isdisjoint(keys):
                busy = [k for k in keys if k in reserved]
                raise ValueError(f"{self.name} tier: already reserved: {busy[:3]!r}")
            self._check_room(sum(counts), self._nfree)
            entries = self._alloc(sizes, counts)
            before = len(reserved)
            reserved.update(zip(keys, entries, strict=True))
            if len(reserved) - before != len(keys):  # a key given twice: undo it all
                for key in keys:
                    reserved.pop(key, None)
                self._release(entries)
                raise ValueError(f"{self.name} tier: a key appears twice in one reservation")
        return [list(e[1]) for e in entries]

    def publish(self, key: BlockKey) -> None:
        """Make a reserved key visible, freeing the slots of any copy it replaces. Raises
        ``KeyError`` if ``key`` is not reserved."""
        self.publish_many([key])

    def publish_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`publish` for a batch; raises ``KeyError`` (publishing none) if any key is
        not reserved."""
        # Three dict operations per key, no sets: tuple keys do not cache their hash, and on a
        # slow machine hashing them dominates a batch of small blocks.
        with self._lock:
            reserved, index = self._reserved, self._index
            popped = [reserved.pop(k, None) for k in keys]
            entries = [e for e in popped if e is not None]
            if len(entries) != len(keys):
                reserved.update((k, e) for k, e in zip(keys, popped, strict=True) if e is not None)
                raise KeyError(next(k for k, e in zip(keys, popped, strict=True) if e is None))
            olds = [index.get(k) for k in keys]
            index.update(zip(keys, entries, strict=True))
            self._release([old for old in olds if old is not None])

    def rekey_reserved(self, pairs: Sequence[tuple[BlockKey, BlockKey]]) -> None:
        """Move reservations from ``old`` to ``new`` keys (a staged place gets the key of the
        block written into it), all or nothing: ``KeyError`` if an old key is not reserved,
        ``ValueError`` if a new one already is."""
        with self._lock:
            reserved = self._reserved
            for old, new in pairs:
                if old not in reserved:
                    raise KeyError(old)
                if new in reserved:
                    raise ValueError(f"{self.name} tier: already reserved: {new!r}")
            if len({new for _, new in pairs}) != len(pairs):
                raise ValueError(f"{self.name} tier: a key appears twice in one rekey")
            for old, new in pairs:
                reserved[new] = reserved.pop(old)

    def unreserve(self, key: BlockKey) -> None:
        """Free a reservation; a key that is not reserved is ignored (abort is idempotent)."""
        with self._lock:
            entry = self._reserved.pop(key, None)
            if entry is not None:
                self._release([entry])

    # -- reads of stored keys ---------------------------------------------------------------
    def extents(self, key: BlockKey) -> Extents:
        """Extents of a stored key, valid until it is deleted or overwritten (the store pins
        it meanwhile). Raises ``KeyError`` if absent."""
        with self._lock:
            entry = self._index[key]
        return list(entry[1])

    def read(self, key: BlockKey) -> bytes:
        """The bytes of a stored key (one copy). Raises ``KeyError`` if absent."""
        with self._lock:
            size, extents = self._index[key]
        return self._copy_out(extents, size)

    # -- Tier -------------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        # Comprehensions and C-level map/zip throughout: at 64 KiB a block's bookkeeping is
        # measured against a 64 KiB memcpy. A key given twice: the last copy wins. bytes and
        # bytearray copy as they are; other buffers are viewed as flat bytes (a memoryview of
        # wider items would otherwise count items, not bytes).
        datas = {k: b if type(b) in _PLAIN else memoryview(b).cast("B") for k, b, _ in items}
        keys, blocks = list(datas), list(datas.values())
        sizes = list(map(len, blocks))
        sb = self.slot_bytes
        counts = [-(-n // sb) for n in sizes]
        needed = sum(counts)
        with self._lock:
            self._check_open()
            index = self._index
            if not self._reserved.keys().isdisjoint(keys):
                busy = [k for k in keys if k in self._reserved]
                raise ValueError(f"{self.name} tier: keys reserved by a writer: {busy[:3]!r}")
            # Overwritten keys disappear first so that both copies never need room at once
            # (the store does not read a key it is writing); then one pop for the whole batch.
            # One dict operation per key here: tuple keys rehash on every lookup.
            olds = [index.pop(k, None) for k in keys]
            replaced = [e for e in olds if e is not None]
            free = self._nfree + sum([-(-e[0] // sb) for e in replaced])
            if needed > free:
                index.update((k, e) for k, e in zip(keys, olds, strict=True) if e is not None)
                self._check_room(needed, free)
            self._release(replaced)
            entries = self._alloc(sizes, counts)
            self._reserved.update(zip(keys, entries, strict=True))  # charged, invisible
        try:
            self._copy_in_many([e[1] for e in entries], blocks)
        except BaseException:  # nothing of the batch becomes visible; replaced keys stay gone
            for key in keys:
                self.unreserve(key)
            raise
        with self._lock:
            self._index.update(zip(keys, map(self._reserved.pop, keys), strict=True))

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        with self._lock:
            entries = [self._index.get(k) for k in keys]
        return [None if e is None else self._copy_out(e[1], e[0]) for e in entries]

    def contains(self, key: BlockKey) -> bool:
        return key in self._index

    def retire(self, key: BlockKey, placeholder: BlockKey) -> None:
        """Take a stored ``key`` out of the index but keep its slots, reserved under
        ``placeholder`` until :meth:`unreserve`: a reader that was handed its extents (a pinned
        shared-memory read) can still copy the bytes it asked for. Raises ``KeyError`` if
        ``key`` is not stored."""
        with self._lock:
            if placeholder in self._reserved:
                raise ValueError(f"{self.name} tier: already reserved: {placeholder!r}")
            self._reserved[placeholder] = self._index.pop(key)

    def delete(self, keys: Sequence[BlockKey]) -> None:
        with self._lock:
            self._release([e for k in keys if (e := self._index.pop(k, None)) is not None])

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

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` unless the free slots and the slots of every stored and
        reserved block are each slot exactly once (for tests and the store's own check)."""
        with self._lock:
            owner = np.zeros(self.num_slots, dtype=np.int64)
            np.add.at(owner, self._free[: self._nfree], 1)
            sb = self.slot_bytes
            for size, extents in [*self._index.values(), *self._reserved.values()]:
                if sum(n for _, n in extents) != size:
                    raise RuntimeError(f"{self.name} tier: extents {extents} do not hold {size}")
                for off, length in extents:
                    owner[off // sb : off // sb + -(-length // sb)] += 1
            if not (owner == 1).all():
                bad = np.flatnonzero(owner != 1)[:5].tolist()
                raise RuntimeError(f"{self.name} tier: slots {bad} are free or used twice/never")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} tier is closed")
