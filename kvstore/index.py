"""The store's index entry: where a block lives and what it must hash to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Entry:
    """One block in the index.

    ``tiers`` is a bitmask of tier positions (bit 0 = top tier) that hold a complete, published
    copy. ``pending`` marks a shared-memory write reserved in the host tier but not yet
    committed: such a block is invisible to get, lookup and contains.
    """

    size: int
    checksum: int
    layout_id: int
    tiers: int = 0
    pending: bool = False
    readers: int = 0  # reads in flight outside the store lock; such a block is not evicted

    def top(self) -> int:
        """Position of the highest tier holding the block (-1 if none)."""
        t = self.tiers
        return (t & -t).bit_length() - 1 if t else -1

    def holds(self, pos: int) -> bool:
        return bool(self.tiers >> pos & 1)

    def positions(self) -> list[int]:
        return [i for i in range(self.tiers.bit_length()) if self.tiers >> i & 1]
