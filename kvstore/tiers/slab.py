"""Fixed-size slot slab shared by the memory tiers (host RAM, device memory).

One preallocated buffer of ``num_slots * slot_bytes`` bytes. A block of ``n`` bytes takes
``ceil(n / slot_bytes)`` slots, not necessarily contiguous; its bytes are laid out across its
slots in order, so a block is a list of *extents* ``(byte offset in slab, length)`` with
adjacent slots merged. Which slots a block gets is up to a
:class:`~kvstore.tiers.slots.SlotAllocator` (a free-slot stack) that the tier owns.

Two-phase writes (the store's zero-copy shared-memory path): :meth:`SlabTier.reserve` (or
``reserve_many`` for a batch) allocates and charges slots for a key that stays invisible, a
client writes the bytes at the returned extents, then :meth:`SlabTier.publish` (``publish_many``)
makes the key visible, replacing any stored copy, or :meth:`SlabTier.unreserve` frees the
slots. ``put_many`` is the same three steps with the copy done here.

Locking: ``_lock`` guards the free list (the allocator has no lock of its own), the index and
the reservations. Byte copies run outside it: the store never touches one key from two threads
at once, and a key's slots cannot be freed or reused while it is reserved or stored, so a copy
never races with a reallocation.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from kvstore.checksum import checksums
from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.tiers.slots import Entry, Extents, SlotAllocator
from kvstore.types import BlockKey


class SlabShare(NamedTuple):
    """How a local client maps a slab without a name: ``fd`` (an open file descriptor of the
    segment, for ``SCM_RIGHTS``), the slab's size and slot size, and where the slots'
    generations (``uint64[size // slot_bytes]``) start in the segment."""

    fd: int
    size: int
    slot_bytes: int
    gen_offset: int


class SlabInfo(NamedTuple):
    """Where a slab lives: the shared-memory name a local client maps (None when the slab is
    not shareable, e.g. device memory), its size in bytes and its slot size."""

    shm_name: str | None
    size: int
    slot_bytes: int


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
        self._slots = SlotAllocator(self.num_slots, self.slot_bytes, self.name)
        self._index: dict[BlockKey, Entry] = {}  # a block's entry is (size, extents)
        self._reserved: dict[BlockKey, Entry] = {}
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

    def _copy_out_many(self, entries: Sequence[Entry | None]) -> list[bytes | None]:
        """:meth:`_copy_out` of each stored entry (None stays None); subclasses may override
        it with a tighter loop."""
        return [None if e is None else self._copy_out(e[1], e[0]) for e in entries]

    @abstractmethod
    def slab_info(self) -> SlabInfo:
        """Where the slab lives, for zero-copy clients."""

    def share(self) -> SlabShare | None:
        """The slab's file descriptor and layout, for a local client to map it; None where
        it cannot be shared (device memory)."""
        return None

    # -- fencing --------------------------------------------------------------------------
    def generations(self, extents: Sequence[Extents | None]) -> list[int | None]:
        """The generation of each block at ``extents`` (see :mod:`kvstore.tiers.slots`): read
        it while the block is pinned or reserved and hand it out with the extents; a changed
        number later means the slots went to another block."""
        gen = self._slots.generation
        return [gen(e) for e in extents]

    # -- accounting ---------------------------------------------------------------------
    def used_bytes(self) -> int:
        return (self.num_slots - self._slots.nfree) * self.slot_bytes

    def charge(self, size: int) -> int:
        return self._slots.count(size) * self.slot_bytes

    def charges(self, sizes: Sequence[int]) -> list[int]:
        if sizes and min(sizes) < 0:
            raise ValueError(f"block size must be non-negative, got {min(sizes)}")
        sb = self.slot_bytes
        return [c * sb for c in self._slots.counts(list(sizes))]

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
        slots = self._slots
        counts = slots.counts(sizes)
        with self._lock:
            self._check_open()
            reserved = self._reserved
            if not reserved.keys().isdisjoint(keys):
                busy = [k for k in keys if k in reserved]
                raise ValueError(f"{self.name} tier: already reserved: {busy[:3]!r}")
            slots.check_room(sum(counts), slots.nfree)
            entries = slots.alloc(sizes, counts)
            before = len(reserved)
            reserved.update(zip(keys, entries, strict=True))
            if len(reserved) - before != len(keys):  # a key given twice: undo it all
                for key in keys:
                    reserved.pop(key, None)
                slots.release(entries)
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
            self._slots.release([old for old in olds if old is not None])

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
                self._slots.release([entry])

    def reserved_keys(self) -> set[BlockKey]:
        """Every key holding reserved (charged, invisible) slots now."""
        with self._lock:
            return set(self._reserved)

    # -- reads of stored keys ---------------------------------------------------------------
    def extents(self, key: BlockKey) -> Extents:
        """Extents of a stored key, valid until it is deleted or overwritten (the store pins
        it meanwhile). Raises ``KeyError`` if absent."""
        with self._lock:
            entry = self._index[key]
        return list(entry[1])

    def sums(self, extents: Sequence[Extents]) -> list[int]:
        """xxh3-64 of the bytes at each block's extents, as they lie now (reserved, staged
        or stored places alike)."""
        return checksums([self._copy_out(ext, sum(n for _, n in ext)) for ext in extents])

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
        slots = self._slots
        counts = slots.counts(sizes)
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
            free = slots.nfree + slots.held(replaced)
            if needed > free:
                index.update((k, e) for k, e in zip(keys, olds, strict=True) if e is not None)
                slots.check_room(needed, free)
            slots.release(replaced)
            entries = slots.alloc(sizes, counts)
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
        return self._copy_out_many(entries)

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
            self._slots.release([e for k in keys if (e := self._index.pop(k, None)) is not None])

    def __len__(self) -> int:
        return len(self._index)

    def health(self) -> dict[str, object]:
        return {
            "ok": not self._closed,
            "slots": self.num_slots,
            "free_slots": self._slots.nfree,
            "blocks": len(self._index),
            "reserved": len(self._reserved),
        }

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` unless the free slots and the slots of every stored and
        reserved block are each slot exactly once (for tests and the store's own check)."""
        with self._lock:
            self._slots.check([*self._index.values(), *self._reserved.values()])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} tier is closed")
