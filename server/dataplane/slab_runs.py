"""Slab places as few runs as they make: neighbouring extents (one ending where the next
starts) become one, so that a socket put's payload is received, and a socket get's reply sent,
with one read or one iovec per run rather than one per block.

The slot allocator hands a batch its slots sorted (``SlotAllocator._pop``), so the places of
a batch of new blocks are mostly one run: 128 blocks of 256 KiB were 128 reads of a Unix
socket each (a syscall and two event loop callbacks apiece) and become a few reads of
whatever the socket holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")
Extent = tuple[int, int]  # (offset, length) in the slab


def transfer_lease_s(frame_timeout_s: float, max_lease_s: float) -> float | None:
    """How long a socket transfer straight to or from the slab holds its places (a get's
    pins, a put's reservation): longer than its frame may take (after ``frame_timeout_s`` the
    connection is dropped and the transfer ended), so the places never go to another block
    while bytes may still move; None where the store would cut such a lease short (copy
    instead)."""
    lease_s = 2 * frame_timeout_s + 5.0
    return lease_s if lease_s <= max_lease_s else None


def coalesce(items: Iterable[Extent | T]) -> list[Extent | T]:
    """``items`` in order with each extent that starts where the one before it ends merged
    into that one; anything that is not an extent (a copy, a scratch buffer) is kept as it
    is and ends the run."""
    out: list[Extent | T] = []
    end = -1  # where the last item, if an extent, ends
    for item in items:
        if isinstance(item, tuple):
            off, n = item
            if off == end:
                last = out[-1]
                assert isinstance(last, tuple)
                out[-1] = (last[0], last[1] + n)
            else:
                out.append((off, n))
            end = off + n
        else:
            out.append(item)
            end = -1
    return out
