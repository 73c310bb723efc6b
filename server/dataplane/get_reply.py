"""A socket ``get``'s reply kept within the frame limit: each distinct block is read once, and
reading stops (with a clear error) as soon as the reply could no longer fit.

The reply's payload is every requested block back to back, repeats included (a repeat is the
same buffer again: no copy), so it is limited to ``max_frame_bytes`` like any frame, and the
official client splits its gets to fit. Reading goes in chunks no larger than the room left,
so a refused get never holds more than the limit in memory, whatever it names.
"""

from __future__ import annotations

from collections import Counter

from kvstore.protocol.frame import FrameError
from kvstore.store import StoreAPI
from kvstore.types import BlockHash


def too_large(count: int, block_bytes: int, limit: int) -> FrameError:
    return FrameError(
        "too_large",
        f"a get reply is limited to the {limit}-byte frame limit; these {count} blocks of "
        f"{block_bytes} bytes do not fit: ask for at most {max(1, limit // block_bytes)} "
        "blocks per get",
    )


def read_within(store: StoreAPI, ns: str, hashes: list[BlockHash], block_bytes: int,
                limit: int) -> list[bytes | None]:
    """Each requested block or None, in request order; raises ``too_large`` (having read at
    most ``limit`` bytes) if the reply's payload would exceed ``limit`` bytes. Blocking: runs
    in a worker thread, one store call per chunk (one in the usual case)."""
    counts = Counter(hashes)
    distinct = list(counts)
    got: dict[BlockHash, bytes] = {}
    reply = 0  # payload bytes of the reply so far, repeats counted
    pos = 0
    while pos < len(distinct):
        room = (limit - reply) // max(1, block_bytes)  # blocks that may still hit
        if room <= 0:
            raise too_large(len(hashes), block_bytes, limit)
        chunk = distinct[pos:pos + room]
        for key, block in zip(chunk, store.get(ns, chunk), strict=True):
            if block is not None:
                got[key] = block
                reply += len(block) * counts[key]
        if reply > limit:
            raise too_large(len(hashes), block_bytes, limit)
        pos += len(chunk)
    return [got.get(key) for key in hashes]


def reply_bound(hashes: list[BlockHash], block_bytes: int, limit: int) -> int:
    """The most memory reading ``hashes`` may take: the distinct blocks, at most ``limit``."""
    return min(len(set(hashes)) * block_bytes, limit)
