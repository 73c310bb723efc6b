"""The disk tier's LMDB environment: opening it, write transactions that grow the map when it
is full and report a full file system, read transactions kept apart from the remap, and close.

``map_size`` starts at twice the capacity plus slack (LMDB rounds each large value up to whole
overflow pages and cannot reuse pages that a live reader still sees) and doubles when a commit
hits ``MapFullError``; the file itself only grows with what is written. Growing remaps the
file, which invalidates open read transactions (and the memoryviews taken from them), so reads
and the remap are kept apart by :class:`~kvstore.tiers.remap_gate.RemapGate`.

Durability: opened with ``sync=True, metasync=True`` and without ``writemap``, a commit is
durable when it returns, so a ``kill -9`` loses at most the batch in flight and never leaves a
half-written value.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from kvstore.errors import DiskFullError, TierUnavailableError
from kvstore.tiers.disk.damage import DAMAGE_ERRORS, DiskPageError
from kvstore.tiers.remap_gate import RemapGate

log = logging.getLogger("kvstore.tiers.disk")

T = TypeVar("T")

MAP_SLACK = 64 << 20  # bytes of map beyond 2x capacity: LMDB meta and branch pages
_MAX_GROW = 8  # doublings tried for one commit before giving up
# what LMDB reports when the file system is full: ENOSPC, or EIO from a short write
_FULL = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EIO, errno.EDQUOT))
_FULL_HOLD_S = 10.0  # a full disk reads as full until writes succeed this long after a failure


def open_env(path: str, map_bytes: int, readahead: bool) -> lmdb.Environment:
    """The LMDB environment in folder ``path`` (created), private to the server's user."""
    try:
        # Cached KV is private to the server's user whatever the umask: the folder 0700,
        # LMDB's files 0600 (chmod too: a folder or files made by an older version).
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        env = lmdb.open(
            path,
            map_size=map_bytes,
            subdir=True,
            readahead=readahead,
            sync=True,
            metasync=True,
            writemap=False,
            max_dbs=0,
            max_readers=512,
            mode=0o600,
        )
        for name in ("data.mdb", "lock.mdb"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(os.path.join(path, name), 0o600)
        return env
    except (OSError, lmdb.Error) as exc:
        raise TierUnavailableError(f"disk tier: cannot open LMDB at {path}: {exc}") from exc


class DiskEnv:
    """One open LMDB environment (readahead on) with its write lock and remap gate.

    ``lock`` serializes write transactions and map growth; the tier also guards what it
    changes alongside a write (its counts, its scratch buffer) with it."""

    def __init__(self, path: str, map_bytes: int) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._env = open_env(path, map_bytes, readahead=True)
        self._gate = RemapGate()
        self.closed = False
        self.full: str | None = None  # why writes fail, while the file system is full
        self._full_at = 0.0  # monotonic time of the last write that failed for it

    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    def read(self, body: Callable[..., T], *args: Any) -> T:
        """``body(txn, *args)`` in one read transaction (``buffers=True``: values are
        memoryviews into the map, valid until ``body`` returns), under the remap gate. Raises
        ``RuntimeError`` once closed, :class:`DiskPageError` if LMDB fails on a damaged page,
        :class:`TierUnavailableError` if it fails otherwise; what ``body`` raises that is
        not an LMDB error (:class:`~kvstore.tiers.disk.damage.PageDamage`) passes. ``body`` is
        a function of the modules below the tier (:mod:`~kvstore.tiers.disk.index`,
        :mod:`~kvstore.tiers.disk.writes`), so no call comes back into the tier."""
        # A method taking a callable rather than a context manager: a generator-based one
        # costs as much as the LMDB lookups of a small batch (get_many, a lookup's chain).
        gate = self._gate
        gate.enter()
        try:
            if self.closed:
                raise RuntimeError("disk tier is closed")
            with self._env.begin(buffers=True) as txn:
                return body(txn, *args)
        except DAMAGE_ERRORS as exc:
            raise DiskPageError(f"disk tier: read failed on a damaged page: {exc}") from exc
        except lmdb.Error as exc:
            raise TierUnavailableError(f"disk tier: read failed: {exc}") from exc
        finally:
            gate.leave()

    def write(self, body: Callable[..., object], *args: Any) -> None:
        """Run ``body(txn, *args)`` in one committed write txn (again after growing the map
        when it is full; :mod:`~kvstore.tiers.disk.writes` has the bodies).
        Caller holds :attr:`lock`. Raises :class:`DiskFullError` when the file system is full
        (and remembers it in :attr:`full`), :class:`DiskPageError` when LMDB fails on a
        damaged page, :class:`TierUnavailableError` on other failures; what ``body`` raises
        that is not an LMDB error passes (the transaction is aborted)."""
        if self.closed:
            raise RuntimeError("disk tier is closed")
        for _ in range(_MAX_GROW):
            try:
                with self._env.begin(write=True, buffers=True) as txn:
                    body(txn, *args)
                if self.full is not None and time.monotonic() - self._full_at > _FULL_HOLD_S:
                    self.full = None  # a write near the limit may fit: not over until it holds
                return
            except lmdb.MapFullError:
                self._grow()
            except DAMAGE_ERRORS as exc:
                raise DiskPageError(f"disk tier: write failed on a damaged page: {exc}") from exc
            except lmdb.Error as exc:
                if any(text in str(exc) for text in _FULL):
                    self.full = f"disk full at {self.path} ({self._free()} bytes free): {exc}"
                    self._full_at = time.monotonic()
                    raise DiskFullError(f"disk tier: {self.full}") from exc
                raise TierUnavailableError(f"disk tier: write failed: {exc}") from exc
        raise TierUnavailableError(f"disk tier: map still full at {self.map_size()} bytes")

    def _free(self) -> int | str:
        """Bytes free for us on the file system of the file ("?" if it cannot be asked)."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return "?"
        return st.f_bavail * st.f_frsize

    def _grow(self) -> None:
        new = 2 * self.map_size()
        with self._gate.exclusive():
            self._env.set_mapsize(new)
        log.info("disk tier %s: map_size grown to %d bytes", self.path, new)

    def flush(self) -> None:
        with self.lock:
            if not self.closed:
                self._env.sync(True)

    def close(self) -> None:
        with self.lock, self._gate.exclusive():
            if self.closed:
                return
            self.closed = True
            self._env.sync(True)
            self._env.close()
