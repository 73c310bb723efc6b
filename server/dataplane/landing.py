"""The checksums of a socket put's blocks, computed as their bytes land in the slab.

The connection tells :class:`Landing` how many payload bytes each read brought; it hashes
those bytes at once, while the kernel's copy has left them in cache, into a running xxh3-64 per
block. The commit then records these checksums (and compares them with the client's) instead
of hashing the whole batch again out of memory: for a batch larger than the cache that second
pass cost as much as the receive.
"""

from __future__ import annotations

import xxhash


class Landing:
    """Running checksums of blocks received back to back. ``blocks[i]`` is block ``i``'s
    places (views, in order), or None for a block received into scratch (not kept: not
    hashed). Every block of a batch has the same size."""

    def __init__(self, blocks: list[list[memoryview] | None]) -> None:
        self._blocks = blocks
        self._size = next((sum(v.nbytes for v in b) for b in blocks if b is not None), 0)
        self._pos = 0  # payload bytes landed so far
        self._hash = xxhash.xxh3_64()
        self._sums: list[int | None] = [None] * len(blocks)

    def landed(self, nbytes: int) -> None:
        """The next ``nbytes`` of the payload have arrived."""
        size = self._size
        if not size:
            return
        lo, hi = self._pos, self._pos + nbytes
        self._pos = hi
        while lo < hi:
            i, start = divmod(lo, size)
            end = min(size, start + hi - lo)
            views = self._blocks[i] if i < len(self._blocks) else None
            if views is not None:
                self._update(views, start, end)
                if end == size:
                    self._sums[i] = self._hash.intdigest()
                    self._hash.reset()
            lo += end - start

    def _update(self, views: list[memoryview], start: int, end: int) -> None:
        """Hash bytes ``start:end`` of one block, whose places are ``views``."""
        at = 0
        for view in views:
            n = view.nbytes
            if at + n > start and at < end:
                self._hash.update(view[max(0, start - at):min(n, end - at)])
            at += n

    def sums(self) -> list[int | None]:
        """Each block's checksum (None for one not kept, or not all landed)."""
        return list(self._sums)
