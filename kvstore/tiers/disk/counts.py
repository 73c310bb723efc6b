"""What a disk tier's file holds, per namespace (blocks and payload bytes), kept as records in
the file itself so that a restart knows it without reading a header per block.

Each write transaction of the tier records its changes here (:meth:`DiskCounts.note` for every
block written or deleted, :meth:`DiskCounts.stage` to write the records into the same
transaction) and, once committed, :meth:`DiskCounts.commit` makes them the current counts. A
file from before the records existed is scanned once, at its first open, and given them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import lmdb

from kvstore.errors import TierUnavailableError
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk.records import COUNTS, COUNTS_PREFIX, INDEX_MARK, counts_key, decode_key
from kvstore.tiers.disk.records import unpack_header as header_of
from kvstore.tiers.lmdb_keys import keys_with

log = logging.getLogger("kvstore.tiers.disk")


class DiskCounts:
    """``namespace -> [blocks, payload bytes]`` of one file, with the changes of the write
    transaction in progress. The tier changes it under its write lock; :meth:`usage`,
    ``used`` and ``blocks`` may be read from any thread without it (each commit publishes a
    new usage map rather than changing the one readers may hold)."""

    def __init__(self, counts: dict[str, list[int]]) -> None:
        self._counts = counts
        self._delta: dict[str, list[int]] = {}
        self._hidden: dict[str, list[int]] = {}  # see hide()
        self.used = sum(c[1] for c in counts.values())
        self.blocks = sum(c[0] for c in counts.values())
        self._view = self._snapshot()

    def _snapshot(self) -> dict[str, tuple[int, int]]:
        out = {}
        for ns, c in self._counts.items():
            hidden = self._hidden.get(ns, (0, 0))
            if c[0] > hidden[0]:
                out[ns] = (c[0] - hidden[0], c[1] - hidden[1])
        return out

    @classmethod
    def read(cls, env: lmdb.Environment, path: str) -> DiskCounts:
        """The counts recorded in ``env``; a file without them is scanned and given them."""
        with env.begin(buffers=True) as txn:
            if txn.get(INDEX_MARK) is not None:
                return cls({bytes(raw[len(COUNTS_PREFIX):]).decode(): list(COUNTS.unpack(value))
                            for raw, value in keys_with(txn, COUNTS_PREFIX)})
            counts: dict[str, list[int]] = {}
            for raw, meta in headers(txn, path):
                have = counts.setdefault(decode_key(raw)[0], [0, 0])
                have[0] += 1
                have[1] += meta.size
        try:
            with env.begin(write=True) as txn:
                for ns, (blocks, size) in counts.items():
                    txn.put(counts_key(ns), COUNTS.pack(blocks, size))
                txn.put(INDEX_MARK, b"1")
        except lmdb.Error as exc:
            raise TierUnavailableError(f"disk tier: cannot write its counts: {exc}") from exc
        return cls(counts)

    # -- one write transaction ---------------------------------------------------------------
    def begin(self) -> None:
        """Start noting a transaction's changes (a retry after the map grew starts over)."""
        self._delta = {}

    def note(self, raw: bytes, blocks: int, nbytes: int) -> None:
        """The block with encoded key ``raw`` changes its namespace's counts by this much."""
        counted = self._delta.setdefault(raw[: raw.index(0)].decode(), [0, 0])
        counted[0] += blocks
        counted[1] += nbytes

    def note_many(self, raws: Iterable[bytes], blocks: Iterable[int],
                  nbytes: Iterable[int]) -> None:
        """:meth:`note` of each block."""
        for raw, n, size in zip(raws, blocks, nbytes, strict=True):
            self.note(raw, n, size)

    def used_after(self) -> int:
        """Payload bytes the file will hold once the noted changes commit."""
        return self.used + sum(c[1] for c in self._delta.values())

    def stage(self, txn: lmdb.Transaction) -> None:
        """Write the changed namespaces' records into ``txn``."""
        for ns, (blocks, nbytes) in self._delta.items():
            have = self._counts.get(ns, (0, 0))
            txn.put(counts_key(ns), COUNTS.pack(have[0] + blocks, have[1] + nbytes))

    def commit(self) -> None:
        """The transaction committed: its changes are the counts now."""
        for ns, (blocks, nbytes) in self._delta.items():
            have = self._counts.setdefault(ns, [0, 0])
            have[0] += blocks
            have[1] += nbytes
            self.blocks += blocks
            self.used += nbytes
        if self._delta:
            self._view = self._snapshot()
        self._delta = {}

    def hide(self, raw: bytes) -> None:
        """The stored block with encoded key ``raw`` is out of reach (on a damaged page, which
        LMDB cannot delete): count it out of ``used``, ``blocks`` and :meth:`usage` from now
        on, as one block of its namespace's mean size (every block of a namespace has one
        size). In this process only: the records in the file go on counting it, since it is
        still in the file and each open finds it again. Caller holds the write lock."""
        ns = raw[: raw.index(0)].decode()
        have = self._counts.get(ns, [0, 0])
        hidden = self._hidden.setdefault(ns, [0, 0])
        if have[0] <= hidden[0]:
            return  # not a block these counts know (never counted, or all hidden)
        size = (have[1] - hidden[1]) // (have[0] - hidden[0])
        hidden[0] += 1
        hidden[1] += size
        self.blocks -= 1
        self.used -= size
        self._view = self._snapshot()

    # -- reading -----------------------------------------------------------------------------
    def usage(self) -> dict[str, tuple[int, int]]:
        """``namespace -> (blocks, payload bytes)`` as of the last commit (do not change it)."""
        return self._view


def headers(txn: lmdb.Transaction, path: str) -> list[tuple[bytes, BlockMeta]]:
    """Every valid (encoded key, meta) that ``txn`` sees; values with a bad header are logged
    and skipped, the tier's own records (keys starting with NUL) too. Only the header bytes of
    each value are touched."""
    found: list[tuple[bytes, BlockMeta]] = []
    for raw, value in txn.cursor():
        if raw[:1] == b"\x00":
            continue
        meta = header_of(value)  # a memoryview: reads the header, copies none
        if meta is None:
            log.warning("disk tier %s: skipping bad header of %r", path, bytes(raw))
            continue
        found.append((bytes(raw), meta))
    return found
