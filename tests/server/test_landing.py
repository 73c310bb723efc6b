"""A socket put's blocks hashed as their bytes land (``server.dataplane.landing``): whatever
pieces the reads bring, each block's checksum is that of its bytes, across blocks split over
several places and beside blocks received into scratch (not hashed)."""

from __future__ import annotations

import os
import random

from kvstore.checksum import checksum
from server.dataplane.landing import Landing

SIZE = 4096


def _places(slab: bytearray, layout: list[list[tuple[int, int]] | None]
            ) -> list[list[memoryview] | None]:
    view = memoryview(slab)
    return [None if ext is None else [view[off:off + n] for off, n in ext] for ext in layout]


def test_every_split_of_the_payload_gives_each_blocks_checksum() -> None:
    rng = random.Random(7)
    slab = bytearray(os.urandom(16 * SIZE))
    layout: list[list[tuple[int, int]] | None] = [
        [(0, SIZE)],                                # one place
        None,                                       # stored already: into scratch
        [(5 * SIZE, 1000), (2 * SIZE, SIZE - 1000)],  # two places, out of order
        [(8 * SIZE, SIZE)],
    ]
    want = [None if ext is None else checksum(b"".join(slab[o:o + n] for o, n in ext))
            for ext in layout]
    total = len(layout) * SIZE
    for _ in range(50):
        landing = Landing(_places(slab, layout))
        done = 0
        while done < total:
            n = min(total - done, rng.choice([1, 7, 999, SIZE, 3 * SIZE + 5]))
            landing.landed(n)
            done += n
        assert landing.sums() == want


def test_a_block_not_all_landed_has_no_checksum() -> None:
    slab = bytearray(os.urandom(2 * SIZE))
    landing = Landing(_places(slab, [[(0, SIZE)], [(SIZE, SIZE)]]))
    landing.landed(SIZE + 10)
    assert landing.sums() == [checksum(slab[:SIZE]), None]
