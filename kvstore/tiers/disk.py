"""Disk tier: one LMDB environment, key = namespace + NUL + hash, value = header + bytes.

Durability: each ``put_many``/``delete`` is one write transaction, atomic and durable when it
returns (:mod:`kvstore.tiers.disk_env` opens, grows, and keeps reads apart from a remap).

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
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import closing
from typing import Any

from kvstore.tiers import disk_index, disk_writes
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.tiers.disk_counts import DiskCounts, headers
from kvstore.tiers.disk_env import MAP_SLACK, DiskEnv, open_env
from kvstore.tiers.disk_records import HEADER, KeyPrefixes, decode_key
from kvstore.types import BlockKey

log = logging.getLogger(__name__)


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
        map_bytes = -(-(map_size or 2 * self.capacity_bytes + MAP_SLACK) // page) * page
        # Two opens in turn, never at once (LMDB allows one handle per file per process).
        with closing(open_env(self.path, map_bytes, readahead=False)) as scan_env:
            self._counts = DiskCounts.read(scan_env, self.path)
        self._env = DiskEnv(self.path, map_bytes)  # its lock also guards _counts, _scratch
        self._scratch = memoryview(bytearray(0))
        self._prefixes = KeyPrefixes()
        if self._counts.used > self.capacity_bytes:
            log.warning(
                "disk tier %s holds %d bytes, over its capacity of %d; the store will evict",
                self.path,
                self._counts.used,
                self.capacity_bytes,
            )

    # -- accounting ---------------------------------------------------------------------
    def used_bytes(self) -> int:
        return self._counts.used

    def map_size(self) -> int:
        return self._env.map_size()

    # -- writes -------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        # a key given twice: the last copy wins
        blocks = dict(zip(self._raws([key for key, _, _ in items]),
                          [(memoryview(buf).cast("B"), meta) for _, buf, meta in items],
                          strict=True))
        if not blocks:
            return  # an empty commit would still cost an fsync
        end = HEADER.size + max(view.nbytes for view, _ in blocks.values())
        with self._env.lock:
            if len(self._scratch) < end:  # one value buffer, reused (disk_writes.put_all)
                self._scratch = memoryview(bytearray(end))
            self._env.write(disk_writes.put_all, blocks, self._counts, self.capacity_bytes,
                            self._scratch)
            self._counts.commit()

    def delete(self, keys: Sequence[BlockKey]) -> None:
        raws = list(dict.fromkeys(self._raws(keys)))
        found = self._env.read(disk_writes.stored, raws)
        if not found:
            return  # an empty commit would still cost an fsync
        with self._env.lock:
            self._env.write(disk_writes.delete_all, found, self._counts)
            self._counts.commit()

    # -- reads ----------------------------------------------------------------------------
    def _raws(self, keys: Sequence[BlockKey]) -> list[bytes]:
        prefixes = self._prefixes
        return [prefixes[ns] + block_hash for ns, block_hash in keys]

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        # The per-block work is kept to C calls (a cached key prefix, map over txn.get, the
        # batch's headers checked at once, one copy out of the map while the txn is open):
        # at 64 KiB every Python step shows against raw py-lmdb.
        raws = self._raws(keys)
        out, bad = self._env.read(disk_writes.read_payloads, raws)
        for i in bad:
            log.warning("disk tier: bad header for %r; treated as absent", keys[i])
        return out

    def contains(self, key: BlockKey) -> bool:
        return self.metas([key])[0] is not None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.contains(key)

    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        """The meta in each key's header (None: not stored, or not ours), one transaction."""
        raws = self._raws(keys)
        return self._env.read(disk_index.metas, raws)

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """How many of a chain's ``hashes``, from the first, this tier holds."""
        prefix = self._prefixes[namespace]
        return self._env.read(disk_index.leading, prefix, hashes)

    def keys_of(self, namespace: str) -> list[BlockKey]:
        return self._env.read(disk_index.namespace_keys, namespace)

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` stored keys about at random, or every key when ``n >= len(self)`` (what a
        sampled eviction policy draws its candidates from)."""
        weights = {ns: blocks for ns, (blocks, _) in self._counts.usage().items()}
        if n >= sum(weights.values()):
            return [k for ns in weights for k in self.keys_of(ns)]
        return self._env.read(disk_index.sample, weights, n, rng)

    def namespace_usage(self) -> dict[str, tuple[int, int]]:
        """``namespace -> (blocks, payload bytes)`` of what the file holds, from its counts."""
        return dict(self._counts.usage())

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """Every block with the meta of its header, read from the file (one pass over every
        value's header: for checks and tools, never on a request path)."""
        found = self._env.read(headers, self.path)
        yield from ((decode_key(raw), meta) for raw, meta in found)

    # -- lifecycle --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._counts.blocks

    def health(self) -> dict[str, Any]:
        """Not ok once closed, or while the file system is full (until a write succeeds):
        ``error`` then says why."""
        env = self._env
        full = env.full
        return {
            "ok": not env.closed and full is None,
            **({"error": full, "disk_full": True} if full is not None else {}),
            "path": self.path,
            "blocks": self._counts.blocks,
            "map_size": None if env.closed else env.map_size(),
        }

    def flush(self) -> None:
        self._env.flush()

    def close(self) -> None:
        self._env.close()
