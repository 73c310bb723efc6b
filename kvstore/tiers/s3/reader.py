"""The S3 tier's read side: blocks served from the write-back queue while queued, else with one
ranged GET per group object for all the blocks wanted from it, each verified alone.

It owns the read traffic counters (``gets``, ``hits``). What the node holds is the
:class:`~kvstore.tiers.s3.holdings.Holdings` shared under the tier's one lock; a group object
found gone is dropped from it here, and its blocks marked missing in the
:class:`~kvstore.tiers.s3.known.KnownBlocks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvstore.tiers.s3.catalog_counts import CatalogLock
from kvstore.tiers.s3.health import S3Health
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.known import KnownBlocks
from kvstore.tiers.s3.objects import S3Objects
from kvstore.tiers.s3.writer import S3Writer
from kvstore.types import BlockKey


@dataclass(slots=True)
class ReadCounts:
    """Blocks the tier was asked for (``gets``) and found (``hits``)."""

    gets: int = 0
    hits: int = 0

Members = list[tuple[int, int, BlockKey]]  # (index in the caller's keys, member, key)


class S3Reader:
    """``get_many`` of one S3 tier: the groups in parallel on ``pool``, the caller waits once.
    Safe from any thread."""

    def __init__(
        self,
        state: S3Health,
        objects: S3Objects,
        pool: ThreadPoolExecutor,
        held: Holdings,
        known: KnownBlocks,
        writer: S3Writer,
        lock: CatalogLock,
    ) -> None:
        self.state = state
        self.counts = ReadCounts()  # under ``lock``
        self._objects = objects
        self._pool = pool
        self._held = held
        self._known = known
        self._writer = writer
        self._lock = lock

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """See :meth:`~kvstore.tiers.s3.tier.S3Tier.get_many`."""
        out: list[bytes | None] = [None] * len(keys)
        remote: dict[BlockKey, Members] = {}
        sizes: dict[BlockKey, int] = {}  # group -> its block size
        for i, (key, held) in enumerate(zip(keys, self._held.find_many(keys), strict=True)):
            if held is None:
                continue
            (_, _, size), where = held
            p = self._writer.queued(where.group)
            if p is not None and p.meta.keys[where.pos : where.pos + 1] == (key,):
                at = where.pos * size  # immutable bytes: sharing them is a copy
                out[i] = p.data if len(p.data) == size else p.data[at : at + size]
            else:
                remote.setdefault(where.group, []).append((i, where.pos, key))
                sizes[where.group] = size
        if remote and not self.state.degraded:
            reads = [(group, members, sizes[group]) for group, members in remote.items()]
            if len(reads) == 1:  # no thread hop for a single object
                results = [self._read_group(*reads[0])]
            else:
                results = list(self._pool.map(lambda r: self._read_group(*r), reads))
            for (_, members, _), datas in zip(reads, results, strict=True):
                for (i, _, _), data in zip(members, datas, strict=True):
                    out[i] = data
        with self._lock:
            self.counts.gets += len(keys)
            self.counts.hits += sum(b is not None for b in out)
        return out

    def _read_group(self, group: BlockKey, members: Members, size: int) -> list[bytes | None]:
        wanted = [(index, key) for _, index, key in members]
        datas, gone = self._objects.read(group, wanted, size)
        if gone:
            with self._lock:  # gone (evicted or replaced by another node): stop claiming it
                if self._writer.queued(group) is None:
                    for key in self._held.lose(group):
                        self._known.mark_missing(key)
        return datas
