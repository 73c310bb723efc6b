"""Splitting batched calls into frames that respect the server's limits (hashes per frame,
payload bytes per frame), shared by both clients."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.client.discovery import Route
from kvstore.protocol import PutReply, ShmPutReply
from kvstore.types import PutResult

_HEADER_ROOM = 1 << 20  # bytes of a frame kept for its header
_GUESS_BLOCK = 1 << 20  # bytes per block assumed before a namespace's size is seen


def slab_room(info: Route) -> int:
    """Bytes one shared-memory batch may reserve or pin in the host slab: a quarter of it, so
    that a batch never needs more room than eviction can make."""
    return max(1, info.shm_size // 4)


def get_batch(info: Route, block_bytes: int | None) -> int:
    """Blocks per shared-memory get: what fits in :func:`slab_room` (blocks of 1 MiB assumed
    until the namespace's size is known)."""
    return max(1, min(info.max_batch, slab_room(info) // (block_bytes or _GUESS_BLOCK)))


def frame_batch(info: Route, block_bytes: int | None) -> int:
    """Blocks per socket get: what a reply frame can carry if every block hits (blocks of
    1 MiB assumed until the namespace's size is known; the server refuses a get whose reply
    would not fit)."""
    room = max(1, info.max_frame_bytes - _HEADER_ROOM)
    return max(1, min(info.max_batch, room // (block_bytes or _GUESS_BLOCK)))


def batches(sizes: Sequence[int] | None, info: Route, count: int | None = None,
            max_bytes: int | None = None) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` ranges covering all items, each at most ``info.max_batch`` items
    and (with ``sizes``) at most the frame payload limit, or ``max_bytes``. An item larger than
    the limit gets a range of its own (the server then refuses it with a clear error)."""
    n = len(sizes) if sizes is not None else int(count or 0)
    limit = max(1, info.max_frame_bytes - _HEADER_ROOM)
    if max_bytes is not None:
        limit = min(limit, max_bytes)
    out: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        hi = min(n, lo + info.max_batch)
        if sizes is not None:
            total, cut = 0, lo
            while cut < hi and (cut == lo or total + sizes[cut] <= limit):
                total += sizes[cut]
                cut += 1
            hi = cut
        out.append((lo, hi))
        lo = hi
    return out


def merge_put(results: Sequence[PutReply | ShmPutReply]) -> PutResult:
    """The put result of a whole call, over its batches' replies."""
    return PutResult(sum(r.stored for r in results), sum(r.existing for r in results),
                     sum(r.refused for r in results))
