"""kvstore behind the simulated workers: one shared set of block hashes that every worker
saves its computed prompt blocks to and loads from.

Unbounded by default; with ``capacity_blocks`` it evicts the least recently used block (a
lookup that hits, or a save, makes a block recent). Only which blocks are held is modelled:
the time a load takes is the worker's (``load_tokens_per_s``), and saves are free (the real
engine saves after its step, off the path of the request's first token).
"""

from __future__ import annotations

from collections import OrderedDict


class SharedStore:
    """Block hashes kvstore holds; owned by one simulation."""

    def __init__(self, capacity_blocks: int | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1 (or None: unbounded)")
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def lookup(self, hashes: list[bytes], touch: bool = True) -> int:
        """Leading blocks of ``hashes`` held (as ``BlockStore.lookup``); with ``touch`` (a
        worker loading them, not a router asking) they become recent."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            if touch:
                self.blocks.move_to_end(h)
            n += 1
        return n

    def save(self, hashes: list[bytes]) -> None:
        """Hold ``hashes`` (already held ones become recent), evicting the oldest if full."""
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        if self.capacity is not None:
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
                self.evictions += 1
