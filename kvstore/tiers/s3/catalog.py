"""The S3 catalog's file: one LMDB environment in a local folder that holds what this node
knows it has in S3 (records in ``catalog_records``), so that nothing per block is kept in
Python objects and a restart keeps that knowledge without listing the bucket.

Writes are batched per tier operation: the tier's lock is a :class:`CatalogFile` batch
(``with catalog.batch:``), and every write made while it is held goes into one write
transaction, committed when the lock is released. A write made without it commits at once.
Reads by the thread holding the batch see its uncommitted writes; other threads read the last
commit (LMDB's readers never wait for the writer).

Durability: opened with ``sync=False`` (a commit costs no fsync): a crash may lose the last
commits, which only makes the node forget blocks it had (found again by discovery) or
remember blocks it had deleted (a read verifies and a miss forgets them); LMDB keeps the file
consistent. ``close`` syncs. Without a ``path`` the file is in a temporary folder removed at
close: knowledge then lasts as long as the tier, as it did in RAM.

The map is reserved at ``map_size`` bytes of address space (the file only grows with what is
written, a few hundred bytes per block): the default, 64 GiB, holds over 100 million blocks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from kvstore.errors import TierUnavailableError
from kvstore.tiers.s3.client import DEFAULT_CATALOG_MAP_SIZE

T = TypeVar("T")


def _remove(env: lmdb.Environment, folder: str | None) -> None:
    with contextlib.suppress(lmdb.Error):
        env.close()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


class CatalogFile:
    """One catalog folder (``path``, created; None: a temporary one removed at close)."""

    def __init__(self, path: str | None = None, map_size: int = DEFAULT_CATALOG_MAP_SIZE) -> None:
        temp = tempfile.mkdtemp(prefix="kvstore-s3-catalog-") if path is None else None
        self.path = temp or os.fspath(path or "")
        self.persistent = temp is None
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            self._env = lmdb.open(self.path, map_size=map_size, subdir=True, sync=False,
                                  metasync=False, readahead=False, max_dbs=0, max_readers=512,
                                  mode=0o600)
        except (OSError, lmdb.Error) as exc:
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise TierUnavailableError(
                f"s3 catalog: cannot open LMDB at {self.path}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _remove, self._env, temp)
        self._mutex = threading.Lock()
        self._owner: int | None = None  # the thread holding the batch
        self._txn: lmdb.Transaction | None = None  # its write transaction, begun at first write

    # -- the batch: the tier's lock ---------------------------------------------------------
    def acquire(self) -> None:
        self._mutex.acquire()
        self._owner = threading.get_ident()

    def release(self) -> None:
        """Commit the batch's writes, then let the next holder in."""
        txn, self._txn, self._owner = self._txn, None, None
        try:
            if txn is not None:
                txn.commit()
        finally:
            self._mutex.release()

    def holding(self) -> bool:
        return self._owner == threading.get_ident()

    # -- transactions -------------------------------------------------------------------------
    def read(self, body: Callable[..., T], *args: Any) -> T:
        """``body(txn, *args)`` in a read transaction (the batch's own while it is held)."""
        if self._txn is not None and self._owner == threading.get_ident():
            return body(self._txn, *args)
        try:
            with self._env.begin() as txn:
                return body(txn, *args)
        except lmdb.Error as exc:
            raise TierUnavailableError(f"s3 catalog: read failed: {exc}") from exc

    def write(self, body: Callable[..., T], *args: Any) -> T:
        """``body(txn, *args)`` in the batch's write transaction while it is held, else in
        one committed now."""
        try:
            if self._owner == threading.get_ident():
                if self._txn is None:
                    self._txn = self._env.begin(write=True)
                return body(self._txn, *args)
            with self._env.begin(write=True) as txn:
                return body(txn, *args)
        except lmdb.Error as exc:
            raise TierUnavailableError(f"s3 catalog: write failed: {exc}") from exc

    # -- lifecycle ----------------------------------------------------------------------------
    def size(self) -> int:
        """Bytes of the file in use (pages written)."""
        info, stat = self._env.info(), self._env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def close(self) -> None:
        """Sync and close (and remove a temporary folder). Idempotent."""
        if self._finalizer.alive:
            with contextlib.suppress(lmdb.Error):
                self._env.sync(True)
            self._finalizer()
