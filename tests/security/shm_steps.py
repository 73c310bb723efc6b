"""Raw shared-memory ops for the security tests: reserve, acquire, commit and put frames sent
as a client would, so that a test can stall between them as a late writer or reader does, and
a stray writer that flips bytes where a block lies in the host slab."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from kvstore.client import KVStoreClient
from kvstore.client.exchange import Call, Link, Steps
from kvstore.protocol import (
    ExtentsReply,
    Put,
    PutReply,
    ShmAcquire,
    ShmCommit,
    ShmRelease,
    ShmReserve,
)

BLOCK = 64 << 10
REAP_S = 2.5  # the server expires leases every second


def blocks(n: int, salt: str, size: int = BLOCK) -> tuple[list[bytes], list[bytes]]:
    """``n`` hashes named by ``salt`` and as many random blocks."""
    return ([hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)],
            [os.urandom(size) for _ in range(n)])


def reserve(link: Link, ns: str, hashes: list[bytes], lease_s: float) -> Steps[ExtentsReply]:
    header, _ = yield Call(ShmReserve(ns, hashes, lease_s))
    return ExtentsReply.from_header(header)


def acquire(link: Link, ns: str, hashes: list[bytes], lease_s: float = 30.0,
            release: bool = False) -> Steps[ExtentsReply]:
    """Pin ``hashes`` for a read; with ``release``, drop the pins at once (only the extents
    are wanted)."""
    header, _ = yield Call(ShmAcquire(ns, hashes, lease_s))
    got = ExtentsReply.from_header(header)
    if release:
        yield Call(ShmRelease(ns, hashes))
    return got


def commit(link: Link, ns: str, hashes: list[bytes], gens: list[int | None],
           sums: list[int | None] | None = None) -> Steps[PutReply]:
    header, _ = yield Call(ShmCommit(ns, hashes, gens, sums))
    return PutReply.from_header(header)


def put_raw(link: Link, ns: str, hashes: list[bytes], data: list[bytes],
            sums: list[int | None]) -> Steps[PutReply]:
    """A socket put that names its own checksums."""
    header, _ = yield Call(Put(ns, hashes, [len(b) for b in data], False, sums), data)
    return PutReply.from_header(header)


def slots(extents: list[Any]) -> set[int]:
    """The first offsets of every extent of every block."""
    return {int(off) for ext in extents if ext is not None for off, _ in ext}


def flip(client: KVStoreClient, ns: str, hashes: list[bytes]) -> None:
    """Flip one byte of each block where it lies in the host slab (as a stray writer with
    the mapping would); ``client`` maps the slab."""
    extents = client._run(acquire, ns, hashes, 30.0, True).extents  # connects: maps the slab
    slab = client._core.slab
    assert slab is not None
    for ext in extents:
        assert ext is not None
        off = int(ext[0][0]) + 100
        slab.buf[off] ^= 0xFF
