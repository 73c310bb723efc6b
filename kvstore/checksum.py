"""Block checksums: xxh3-64 over the block's bytes (several GB/s, no per-byte Python).

A block's checksum is recorded when it is acknowledged and verified wherever its bytes leave
(``docs/operations.md``, "Integrity"). :func:`copy_summed` copies and hashes in one pass, a
chunk at a time while the chunk is still in cache, for readers that copy out of shared memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

from kvstore.copying import scratch_for, trapped
from kvstore.types import Buffer

CHUNK = 128 * 1024  # bytes copied then hashed at a time: fits in L2 with room to spare


def checksum(data: Buffer) -> int:
    """xxh3-64 of ``data`` as an unsigned int."""
    return xxhash.xxh3_64_intdigest(data)


def checksums(datas: Iterable[Buffer]) -> list[int]:
    """:func:`checksum` of each buffer."""
    return list(map(xxhash.xxh3_64_intdigest, datas))


def checksum_parts(parts: Sequence[Buffer]) -> int:
    """:func:`checksum` of the concatenation of ``parts`` (a block over several extents),
    without joining them."""
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0])
    h = xxhash.xxh3_64()
    for part in parts:
        h.update(part)
    return h.intdigest()


def copy_summed(dest: memoryview, src: memoryview, h: xxhash.xxh3_64, *,
                of_src: bool = False) -> None:
    """Copy ``src`` into ``dest`` (same length, flat bytes), adding the bytes to the running
    hash ``h`` a chunk at a time right after copying the chunk (still in cache): those of
    ``dest``, or with ``of_src`` those of ``src`` (a writer hashes what it meant to write,
    not a shared destination that another process may change). A copy that would step into
    the 4K-aliasing trap (:mod:`kvstore.copying`) goes through scratch and hashes the
    scratch, which holds the same bytes."""
    n = src.nbytes
    if trapped(dest, src):  # through scratch, hashed there: the bytes copied either way
        tmp = scratch_for(src, min(n, CHUNK))
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            part = tmp[:hi - lo]
            part[:] = src[lo:hi]
            dest[lo:hi] = part
            h.update(part)
        return
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        dest[lo:hi] = src[lo:hi]
        h.update(src[lo:hi] if of_src else dest[lo:hi])
