"""Block checksums: xxh3-64 over the block's bytes (several GB/s, no per-byte Python)."""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

from kvstore.tiers.base import Buffer


def checksum(data: Buffer) -> int:
    """xxh3-64 of ``data`` as an unsigned int."""
    return xxhash.xxh3_64_intdigest(data)


def checksums(datas: Iterable[Buffer]) -> list[int]:
    """:func:`checksum` of each buffer."""
    return list(map(xxhash.xxh3_64_intdigest, datas))
