"""Disk tier: one LMDB environment, key = namespace + NUL + hash, value = header + bytes.

Durability: LMDB commits are atomic and, opened with ``sync=True, metasync=True`` and without
``writemap``, durable when ``commit()`` returns, so a ``kill -9`` loses at most the batch in
flight and never leaves a half-written value. Each ``put_many``/``delete`` is one write
transaction.

The value starts with a fixed header (:mod:`kvstore.tiers.disk_records`: magic, version,
layout id, checksum, payload size). A value whose magic is wrong is not ours (or is damaged):
reads treat it as absent and scans skip it. Payload checksums are checked by the store
(``verify_reads``), never here.

The file is its own index (``indexes_itself``): the store asks it, not a map in RAM, whether it
holds a block and with which meta (:mod:`kvstore.tiers.disk_index`: a B-tree lookup and the
64-byte header, never the payload), so a restart reads nothing per block. What must be known
without a lookup, the blocks and payload bytes of each namespace, is kept in count records
written in the same transaction as the blocks; a file from before them is scanned once, at
its first open, to write them (on a handle with readahead off: reading one header page per
value would otherwise pull in the whole file).

``map_size`` starts at twice the capacity plus slack (LMDB rounds each large value up to whole
overflow pages and cannot reuse pages that a live reader still sees) and doubles when a commit
hits ``MapFullError``; the file itself only grows with what is written. Growing remaps the
file, which invalidates open read transactions (and the memoryviews ``get_many`` copies
from), so reads and the remap are kept apart by :class:`RemapGate`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import lmdb

from kvstore.errors import CapacityError, DiskFullError, TierUnavailableError
from kvstore.tiers import disk_index
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.tiers.disk_counts import DiskCounts, headers
from kvstore.tiers.disk_records import HEADER, MAGIC, VERSION, decode_key, encode_key, payload_size
from kvstore.tiers.remap_gate import RemapGate
from kvstore.types import BlockKey

log = logging.getLogger(__name__)

_MAP_SLACK = 64 << 20  # bytes of map beyond 2x capacity: LMDB meta and branch pages
_MAX_GROW = 8  # doublings tried for one commit before giving up
# what LMDB reports when the file system is full: ENOSPC, or EIO from a short write
_FULL = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EIO, errno.EDQUOT))
_FULL_HOLD_S = 10.0  # a full disk reads as full until writes succeed this long after a failure


class DiskTier(Tier):
    """LMDB tier (options: ``path`` (a directory, created), ``map_size``)."""

    name = "disk"
    persistent = True
    verify_reads = True
    indexes_itself = True

    def __init__(self, capacity_bytes: int, path: str, map_size: int | None = None) -> None:
        super().__init__(capacity_bytes)
        self.path = os.fspath(path)
        page = os.sysconf("SC_PAGE_SIZE")
        self._map_bytes = -(-(map_size or 2 * self.capacity_bytes + _MAP_SLACK) // page) * page
        # Two opens in turn, never at once (LMDB allows one handle per file per process).
        scan_env = self._open(readahead=False)
        try:
            self._counts = DiskCounts.read(scan_env, self.path)
        finally:
            scan_env.close()
        self._env = self._open(readahead=True)
        self._write_lock = threading.Lock()  # one write txn, map growth, _counts, _scratch
        self._scratch = memoryview(bytearray(0))
        self._gate = RemapGate()
        self._closed = False
        self._full: str | None = None  # why writes fail, while the file system is full
        self._full_at = 0.0  # monotonic time of the last write that failed for it
        if self._counts.used > self.capacity_bytes:
            log.warning(
                "disk tier %s holds %d bytes, over its capacity of %d; the store will evict",
                self.path,
                self._counts.used,
                self.capacity_bytes,
            )

    def _open(self, readahead: bool) -> lmdb.Environment:
        try:
            # Cached KV is private to the server's user whatever the umask: the folder 0700,
            # LMDB's files 0600 (chmod too: a folder or files made by an older version).
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            os.chmod(self.path, 0o700)
            env = lmdb.open(
                self.path,
                map_size=self._map_bytes,
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
                    os.chmod(os.path.join(self.path, name), 0o600)
            return env
        except (OSError, lmdb.Error) as exc:
            msg = f"disk tier: cannot open LMDB at {self.path}: {exc}"
            raise TierUnavailableError(msg) from exc

    # -- accounting ---------------------------------------------------------------------
    def used_bytes(self) -> int:
        return self._counts.used

    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    # -- writes -------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        blocks: dict[bytes, tuple[memoryview, BlockMeta]] = {}
        for key, buf, meta in items:  # a key given twice: the last copy wins
            blocks[encode_key(key)] = (memoryview(buf).cast("B"), meta)
        if not blocks:
            return  # an empty commit would still cost an fsync
        with self._write_lock:
            self._check_open()
            self._write(lambda txn: self._put_all(txn, blocks))
            self._counts.commit()

    def _put_all(
        self, txn: lmdb.Transaction, blocks: dict[bytes, tuple[memoryview, BlockMeta]]
    ) -> None:
        """Counts first (a key already stored is an overwrite: its old payload no longer
        counts), refused as a whole past the capacity; then header + payload of each block
        through one reused scratch buffer: LMDB copies the
        value into its own pages during ``put``, so the buffer is free again at once, and a
        warm buffer saves the allocation, zeroing and page faults of a fresh value per block
        (py-lmdb has no MDB_RESERVE to write into LMDB's pages directly). Caller holds
        ``_write_lock``."""
        counts = self._counts
        counts.begin()
        for raw, (view, _) in blocks.items():
            old = payload_size(txn.get(raw))
            counts.note(raw, old is None, view.nbytes - (old or 0))
        used = counts.used_after()
        if used > self.capacity_bytes:
            raise CapacityError(
                f"disk tier: {used} bytes needed of a capacity of {self.capacity_bytes}"
            )
        for raw, (view, meta) in blocks.items():
            end = HEADER.size + view.nbytes
            if len(self._scratch) < end:
                self._scratch = memoryview(bytearray(end))
            scratch = self._scratch
            HEADER.pack_into(scratch, 0, MAGIC, VERSION, meta.layout_id, meta.checksum, view.nbytes)
            scratch[HEADER.size : end] = view
            txn.put(raw, scratch[:end])
        counts.stage(txn)

    def delete(self, keys: Sequence[BlockKey]) -> None:
        with self._reading() as txn:  # an empty commit would still cost an fsync
            raws = [raw for raw in dict.fromkeys(map(encode_key, keys))
                    if payload_size(txn.get(raw)) is not None]
        if not raws:
            return
        with self._write_lock:
            self._check_open()
            counts = self._counts

            def body(txn: lmdb.Transaction) -> None:
                counts.begin()
                for raw in raws:
                    old = payload_size(txn.get(raw))
                    if old is not None:  # else absent, or not ours: nothing counted
                        txn.delete(raw)
                        counts.note(raw, -1, -old)
                counts.stage(txn)

            self._write(body)
            counts.commit()

    def _write(self, body: Any) -> None:
        """Run ``body(txn)`` in one committed write txn, growing the map when it is full.
        Caller holds ``_write_lock``."""
        for _ in range(_MAX_GROW):
            try:
                with self._env.begin(write=True, buffers=True) as txn:
                    body(txn)
                if self._full is not None and time.monotonic() - self._full_at > _FULL_HOLD_S:
                    self._full = None  # a write near the limit may fit: not over until it holds
                return
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                if any(text in str(exc) for text in _FULL):
                    self._full = f"disk full at {self.path} ({self._free()} bytes free): {exc}"
                    self._full_at = time.monotonic()
                    raise DiskFullError(f"disk tier: {self._full}") from exc
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

    # -- reads ----------------------------------------------------------------------------
    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        # The per-block work is kept to C calls (encode, map over txn.get, unpack, one copy):
        # at 64 KiB every Python step shows against raw py-lmdb.
        raws = [ns.encode() + b"\x00" + block_hash for ns, block_hash in keys]
        out: list[bytes | None] = []
        hs, unpack = HEADER.size, HEADER.unpack_from
        self._gate.enter()
        try:
            self._check_open()
            with self._env.begin(buffers=True) as txn:
                for key, value in zip(keys, map(txn.get, raws), strict=True):
                    if value is None:
                        out.append(None)
                        continue
                    # unpack_header() inlined, no BlockMeta; the memoryview points into the map
                    # (valid until the txn ends): one copy of the payload.
                    if len(value) >= hs:
                        magic, version, _layout, _checksum, size = unpack(value)
                        if magic == MAGIC and version == VERSION and hs + size == len(value):
                            out.append(bytes(value[hs:]))
                            continue
                    log.warning("disk tier: bad header for %r; treated as absent", key)
                    out.append(None)
        except lmdb.Error as exc:
            raise TierUnavailableError(f"disk tier: read failed: {exc}") from exc
        finally:
            self._gate.leave()
        return out

    @contextlib.contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction]:
        """One read transaction, under the remap gate."""
        self._gate.enter()
        try:
            self._check_open()
            with self._env.begin(buffers=True) as txn:
                yield txn
        except lmdb.Error as exc:
            raise TierUnavailableError(f"disk tier: read failed: {exc}") from exc
        finally:
            self._gate.leave()

    def contains(self, key: BlockKey) -> bool:
        return self.metas([key])[0] is not None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.contains(key)

    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        """The meta in each key's header (None: not stored, or not ours), one transaction."""
        with self._reading() as txn:
            return disk_index.metas(txn, [encode_key(k) for k in keys])

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """How many of a chain's ``hashes``, from the first, this tier holds."""
        with self._reading() as txn:
            return disk_index.leading(txn, namespace.encode() + b"\x00", hashes)

    def keys_of(self, namespace: str) -> list[BlockKey]:
        with self._reading() as txn:
            return disk_index.namespace_keys(txn, namespace)

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` stored keys about at random, or every key when ``n >= len(self)`` (what a
        sampled eviction policy draws its candidates from)."""
        weights = {ns: blocks for ns, (blocks, _) in self._counts.usage().items()}
        if n >= sum(weights.values()):
            return [k for ns in weights for k in self.keys_of(ns)]
        with self._reading() as txn:
            return disk_index.sample(txn, weights, n, rng)

    def namespace_usage(self) -> dict[str, tuple[int, int]]:
        """``namespace -> (blocks, payload bytes)`` of what the file holds, from its counts."""
        return dict(self._counts.usage())

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """Every block with the meta of its header, read from the file (one pass over every
        value's header: for checks and tools, never on a request path)."""
        with self._reading() as txn:
            found = headers(txn, self.path)
        yield from ((decode_key(raw), meta) for raw, meta in found)

    # -- lifecycle --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._counts.blocks

    def health(self) -> dict[str, Any]:
        """Not ok once closed, or while the file system is full (until a write succeeds):
        ``error`` then says why."""
        full = self._full
        return {
            "ok": not self._closed and full is None,
            **({"error": full, "disk_full": True} if full is not None else {}),
            "path": self.path,
            "blocks": self._counts.blocks,
            "map_size": None if self._closed else self.map_size(),
        }

    def flush(self) -> None:
        with self._write_lock:
            if not self._closed:
                self._env.sync(True)

    def close(self) -> None:
        with self._write_lock, self._gate.exclusive():
            if self._closed:
                return
            self._closed = True
            self._env.sync(True)
            self._env.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("disk tier is closed")

