"""The S3 catalog's counts: the totals (live bytes, dead bytes, group objects) and each
namespace's live blocks and bytes, kept in RAM and written to the catalog with the batch that
changed them, so that a restart reads them, and nothing per block, to know what it holds.

A catalog of another format or of another bucket and prefix (its identity record disagrees)
is emptied at open: its records would name objects that are not this tier's.
"""

from __future__ import annotations

import logging
from typing import cast

import lmdb

from kvstore.tiers.s3.catalog import CatalogFile
from kvstore.tiers.s3.catalog_records import (
    IDENTITY,
    NS_COUNT,
    TOTALS,
    pack_count,
    pack_totals,
    unpack_count,
    unpack_totals,
)

log = logging.getLogger("kvstore.s3")
_PUT, _DELETE = lmdb.Transaction.put, lmdb.Transaction.delete


def _load(txn: lmdb.Transaction, identity: bytes) -> tuple[tuple[int, int, int],
                                                          dict[str, tuple[int, int]]]:
    if txn.get(IDENTITY) != identity:
        if txn.get(IDENTITY) is not None:
            log.warning("s3 catalog is of another bucket, prefix or format: started afresh")
        cur = txn.cursor()
        if cur.first():
            while cur.delete():
                pass
        txn.put(IDENTITY, identity)
    raw = cast(bytes | None, txn.get(TOTALS))
    counts: dict[str, tuple[int, int]] = {}
    cur = txn.cursor()
    if cur.set_range(NS_COUNT):
        for k, v in cur:
            if not bytes(k).startswith(NS_COUNT):
                break
            counts[bytes(k[1:]).decode()] = unpack_count(bytes(v))
    return (unpack_totals(raw) if raw is not None else (0, 0, 0)), counts


class CatalogCounts:
    """Totals and namespace counts of one catalog, read at open (``identity`` names the
    catalog's format, endpoint, bucket and prefix)."""

    def __init__(self, file: CatalogFile, identity: bytes) -> None:
        self._file = file
        (self.used, self.dead_bytes, self.objects), self._ns = file.write(_load, identity)
        self.blocks = sum(b for b, _ in self._ns.values())
        self._dirty: set[str] = set()  # namespaces whose counts changed since the last save
        self._changed = False  # anything changed since the last save

    def count(self, namespace: str, size: int, sign: int) -> None:
        """A live block of ``size`` bytes more (``sign`` +1) or less (-1)."""
        blocks, nbytes = self._ns.get(namespace, (0, 0))
        self._ns[namespace] = (blocks + sign, nbytes + sign * size)
        self.blocks += sign
        self.used += sign * size
        self._dirty.add(namespace)
        self._changed = True

    def dead(self, size: int) -> None:
        self.dead_bytes += size
        self._changed = True

    def object(self, sign: int) -> None:
        self.objects += sign
        self._changed = True

    def usage(self) -> dict[str, tuple[int, int]]:
        """``namespace -> (live blocks, bytes)``, namespaces holding a block only."""
        return {ns: c for ns, c in self._ns.items() if c[0]}

    def save(self) -> None:
        """Write what changed since the last save (inside the current batch, if held)."""
        if not self._changed:
            return
        write = self._file.write
        for ns in self._dirty:
            blocks, nbytes = self._ns.get(ns, (0, 0))
            if blocks:
                write(_PUT, NS_COUNT + ns.encode(), pack_count(blocks, nbytes))
            else:
                self._ns.pop(ns, None)
                write(_DELETE, NS_COUNT + ns.encode())
        self._dirty.clear()
        self._changed = False
        write(_PUT, TOTALS, pack_totals(self.used, self.dead_bytes, self.objects))


class CatalogLock:
    """The S3 tier's one lock: ``with held.lock:`` guards the holdings (and whatever the tier's
    parts guard with it); the catalog writes made under it, the counts with them, commit
    together on release."""

    __slots__ = ("_counts", "_file")

    def __init__(self, file: CatalogFile, counts: CatalogCounts) -> None:
        self._file = file
        self._counts = counts

    def __enter__(self) -> None:
        self._file.acquire()

    def __exit__(self, *exc: object) -> None:
        try:
            self._counts.save()
        finally:
            self._file.release()
