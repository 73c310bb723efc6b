"""Free-slot allocator of a slot slab: hands out slot lists and turns them into extents.

A block of ``n`` bytes takes ``ceil(n / slot_bytes)`` slots, not necessarily contiguous; its
bytes are laid out across its slots in order, so a block is a list of *extents* ``(byte offset
in slab, length)``, one per run of contiguous slots.

The free list is a numpy int64 stack (``_free[:nfree]``); allocation pops a slice off its top
(sorted) and freeing pushes a block's slots back, so the put path creates no Python object per
slot. The stack starts as ``num_slots-1 .. 0``, so a fresh slab hands out ascending contiguous
runs, and a block of n slots freed and followed by an allocation of n slots gets the same run
back. This is a stack, not a best-fit allocator: after churn of mixed sizes a block may span
several runs, which costs one extent each and nothing else.

Generations (fencing): every slot has a generation number (``gens``, uint64) that
:meth:`SlotAllocator.release` bumps each time the slot is freed. A block's generation is that
of its first slot while the block holds it; a client handed extents and a generation can tell,
by reading the number again, whether the slots still belong to that block (the host tier keeps
``gens`` in its shared segment so that clients read it themselves). All slots of a block are
freed together, so the first slot's number moves exactly when the block's slots may have gone
to another block.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from kvstore.errors import CapacityError

Extents = list[tuple[int, int]]

# A block's entry: (size, extents). The extents, computed once at allocation, are all a block
# keeps: its slots are ``off // slot_bytes`` onwards for each extent, rebuilt with numpy for a
# whole batch when freed. Reads touch no numpy at all. A plain tuple, no per-block numpy slice:
# on this path each costs a fair part of a 64 KiB memcpy.
Entry = tuple[int, Extents]


class Fenced(NamedTuple):
    """Extents handed to a client (one per block asked for, None where it gets none) and the
    generation of each, read in the same hold of the store lock that pinned or reserved them.

    Read later, a generation may already be another block's: the pin can run out, or the
    reservation be freed, between the two, and the slots go to another block; a client
    fenced by the new owner's number would then copy that block's bytes as its own."""

    extents: list[Extents | None]
    gens: list[int | None]


class Granted(NamedTuple):
    """Extents pinned for reading, with their generations (as :class:`Fenced`) and each
    block's recorded checksum (None where it has no extents): the reader checks its copy
    against it."""

    extents: list[Extents | None]
    gens: list[int | None]
    sums: list[int | None]


class FencedPlaces(NamedTuple):
    """Staged places (:mod:`kvstore.store.staging`) and their generations, read as they were
    staged (see :class:`Fenced`)."""

    places: list[Extents]
    gens: list[int | None]


class SlotAllocator:
    """The free slots of a slab of ``num_slots`` slots of ``slot_bytes`` each, handed out as
    block entries. ``name`` is the owning tier's kind, for error messages.

    Not thread-safe, and no lock of its own: :class:`~kvstore.tiers.slab.SlabTier` calls
    :meth:`alloc`, :meth:`release` and :meth:`check` with its ``_lock`` held, which guards the
    free list. ``nfree`` (free slots) is for reading only; a read without the lock (stats) is
    one int, possibly stale."""

    def __init__(self, num_slots: int, slot_bytes: int, name: str,
                 gens: np.ndarray | None = None) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.name = name
        # generation of each slot, bumped on every release (see the module docstring)
        self.gens = np.zeros(num_slots, dtype=np.uint64) if gens is None else gens
        self._desc = np.arange(num_slots - 1, -1, -1, dtype=np.int64)
        self._free = self._desc.copy()
        self.nfree = num_slots

    # -- slot counts (no state) -----------------------------------------------------------
    def count(self, size: int) -> int:
        """Slots a block of ``size`` bytes takes. Raises ``ValueError`` if ``size`` < 0."""
        if size < 0:
            raise ValueError(f"block size must be non-negative, got {size}")
        return -(-int(size) // self.slot_bytes)

    def counts(self, sizes: list[int]) -> list[int]:
        """Slots each block of ``sizes`` takes (sizes already checked non-negative)."""
        sb = self.slot_bytes
        return [-(-n // sb) for n in sizes]

    def held(self, entries: list[Entry]) -> int:
        """Slots the blocks of ``entries`` hold together."""
        sb = self.slot_bytes
        return sum([-(-e[0] // sb) for e in entries])

    def check_room(self, needed: int, available: int) -> None:
        """Raise :class:`CapacityError` if ``needed`` slots exceed ``available`` ones."""
        if needed > available:
            raise CapacityError(
                f"{self.name} tier: {needed} slots needed, {available} available of "
                f"{self.num_slots}"
            )

    # -- allocation (caller holds the tier's lock) ------------------------------------------
    def alloc(self, sizes: list[int], counts: list[int]) -> list[Entry]:
        """Entries for blocks of ``sizes`` taking ``counts`` slots, from one pop. The caller
        checked (:meth:`check_room`) that enough slots are free."""
        sb = self.slot_bytes
        slots = self._pop(sum(counts))
        if len(slots) == len(sizes) and all(counts):  # one slot per block: the 64 KiB case
            return [(size, [(slot * sb, size)]) for slot, size in zip(slots, sizes, strict=True)]
        entries: list[Entry] = []
        at = 0
        for n, size in zip(counts, sizes, strict=True):
            if n and slots[at + n - 1] - slots[at] == n - 1:  # one contiguous run: common case
                entries.append((size, [(slots[at] * sb, size)]))
            else:
                entries.append((size, self._runs(slots[at : at + n], size) if n else []))
            at += n
        return entries

    def release(self, entries: Iterable[Entry]) -> None:
        """Push the slots of ``entries`` back on the free list, lowest slot of each run on
        top. A run's slots are copied from a slice of ``_desc`` (every slot number,
        descending), so freeing makes no array and no Python int per slot."""
        sb, free, desc, last = self.slot_bytes, self._free, self._desc, self.num_slots - 1
        runs = [run for _size, extents in entries for run in extents]
        if not runs:
            return
        ns = [-(-length // sb) for _, length in runs]
        top = self.nfree
        gens = self.gens
        if max(ns) == 1:  # one slot per run (64 KiB blocks): all back in one assignment
            singles = [off // sb for off, _ in reversed(runs)]
            gens[singles] += 1  # fence first: a stale holder of these extents must see it
            free[top : top + len(singles)] = singles
            self.nfree = top + len(singles)
            return
        for (off, _length), n in zip(runs, ns, strict=True):
            first = off // sb  # desc[last - first - n + 1 : last - first + 1] is first+n-1..first
            gens[first : first + n] += 1
            free[top : top + n] = desc[last - first - n + 1 : last - first + 1]
            top += n
        self.nfree = top

    def generation(self, extents: Extents | None) -> int | None:
        """The generation of the block at ``extents`` (that of its first slot); None for
        None or an empty block. Stable while the block holds its slots."""
        if not extents:
            return None
        return int(self.gens[extents[0][0] // self.slot_bytes])

    def check(self, entries: Iterable[Entry]) -> None:
        """Raise ``RuntimeError`` unless the free slots and the slots of ``entries`` (every
        stored and reserved block) are each slot exactly once, and each entry's extents hold
        its size."""
        owner = np.zeros(self.num_slots, dtype=np.int64)
        np.add.at(owner, self._free[: self.nfree], 1)
        sb = self.slot_bytes
        for size, extents in entries:
            if sum(n for _, n in extents) != size:
                raise RuntimeError(f"{self.name} tier: extents {extents} do not hold {size}")
            for off, length in extents:
                owner[off // sb : off // sb + -(-length // sb)] += 1
        if not (owner == 1).all():
            bad = np.flatnonzero(owner != 1)[:5].tolist()
            raise RuntimeError(f"{self.name} tier: slots {bad} are free or used twice/never")

    def _pop(self, n: int) -> list[int]:
        """Take ``n`` slots off the stack, sorted so that whatever runs of neighbours they hold
        merge into as few extents as possible. A temporary list of ints: the caller turns it
        into a block's extents at once, and plain ints beat numpy scalars there."""
        top = self.nfree
        self.nfree = top - n
        taken = self._free[top - n : top]
        return sorted(taken.tolist()) if n <= 128 else np.sort(taken).tolist()

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
