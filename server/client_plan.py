"""Splitting batched calls into frames that respect the server's limits (hashes per frame,
payload bytes per frame), shared by both clients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.discovery import ServerInfo

_HEADER_ROOM = 1 << 20  # bytes of a frame kept for its header


def batches(sizes: Sequence[int] | None, info: ServerInfo,
            count: int | None = None) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` ranges covering all items, each at most ``info.max_batch`` items
    and (with ``sizes``) at most the frame payload limit. An item larger than the limit gets
    a range of its own (the server then refuses it with a clear error)."""
    n = len(sizes) if sizes is not None else int(count or 0)
    limit = max(1, info.max_frame_bytes - _HEADER_ROOM)
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


def merge_put(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(int(r.get(k, 0)) for r in results) for k in ("stored", "existing", "refused")}
