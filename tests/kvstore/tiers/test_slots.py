"""The slot allocator on its own: extents of contiguous runs, exhaustion, freed slots reused."""

from __future__ import annotations

import pytest

from kvstore.errors import CapacityError
from kvstore.tiers.slots import SlotAllocator

SB = 100


def test_fresh_allocator_hands_out_ascending_contiguous_runs() -> None:
    slots = SlotAllocator(8, SB, "test")
    sizes = [250, 100, 0, 1]
    entries = slots.alloc(sizes, slots.counts(sizes))
    assert entries == [(250, [(0, 250)]), (100, [(300, 100)]), (0, []), (1, [(400, 1)])]
    assert slots.nfree == 3
    slots.check(entries)


def test_block_over_non_contiguous_slots_gets_one_extent_per_run() -> None:
    slots = SlotAllocator(6, SB, "test")
    a, b, c = slots.alloc([100, 100, 100], [1, 1, 1])  # slots 0, 1, 2
    slots.release([a, c])  # free slots 0 and 2 (plus 3..5)
    [big] = slots.alloc([350], [4])  # slots 0, 2, 3, 4
    assert big == (350, [(0, 100), (200, 250)])
    slots.check([b, big])


def test_exhaustion_raises_capacity_error() -> None:
    slots = SlotAllocator(4, SB, "test")
    slots.alloc([300], [3])
    with pytest.raises(CapacityError, match="test tier: 2 slots needed, 1 available of 4"):
        slots.check_room(slots.count(101), slots.nfree)
    with pytest.raises(ValueError, match="non-negative"):
        slots.count(-1)


def test_freed_slots_are_reused_first() -> None:
    slots = SlotAllocator(8, SB, "test")
    first, second = slots.alloc([200, 200], [2, 2])
    slots.release([first])
    assert slots.held([first, second]) == 4
    assert slots.alloc([200], [2]) == [first]
    slots.check([first, second])


def test_check_finds_a_slot_both_free_and_used() -> None:
    slots = SlotAllocator(4, SB, "test")
    [entry] = slots.alloc([100], [1])
    with pytest.raises(RuntimeError, match="free or used twice/never"):
        slots.check([entry, entry])
