"""Disk tier: one LMDB environment, key = namespace + NUL + hash, value = header + bytes.

Durability: each ``put_many``/``delete`` is one write transaction, atomic and durable when it
returns (:mod:`kvstore.tiers.disk.env` opens, grows, and keeps reads apart from a remap).

The value starts with a fixed header (:mod:`kvstore.tiers.disk.records`: magic, version,
layout id, checksum, payload size). A value whose magic is wrong is not ours (or is damaged):
reads treat it as absent and scans skip it. Payload checksums are checked by the store
(``verify_reads``), never here.

The file is its own index (an :class:`~kvstore.tiers.base.IndexedTier`): the store asks it, not
a map in RAM, whether it holds a block and with which meta (:mod:`kvstore.tiers.disk.index`: a
B-tree lookup and the 64-byte header, never the payload), so a restart reads nothing per block.
What must be known without a lookup, the blocks and payload bytes of each namespace, is kept in
count records written in the same transaction as the blocks; a file from before them is scanned
once, at its first open, to write them (on a handle with readahead off: reading one header page
per value would otherwise pull in the whole file).

A damaged page costs only the keys on it (:mod:`kvstore.tiers.disk.damage`): reads, puts
and deletes go on without the keys LMDB fails on, which read as absent from then on; the
store takes them (:meth:`DiskTier.take_damaged`) to count them as corrupt, and
:meth:`DiskTier.health` shows what was found.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import asdict
from typing import Any, TypeVar

from kvstore.tiers.base import BlockMeta, Buffer, IndexedTier
from kvstore.tiers.disk import index as disk_index
from kvstore.tiers.disk import writes as disk_writes
from kvstore.tiers.disk.counts import DiskCounts, headers
from kvstore.tiers.disk.damage import (
    DamageCause,
    DamagedKeys,
    DamageReport,
    DiskPageError,
    PageDamage,
    aligned,
    less,
    without,
)
from kvstore.tiers.disk.env import MAP_SLACK, DiskEnv, open_env
from kvstore.tiers.disk.records import HEADER, KeyPrefixes, decode_key
from kvstore.types import BlockKey, CorruptCause

log = logging.getLogger("kvstore.tiers.disk")

T = TypeVar("T")
_BAD_HEADER = "bad header (not a valid kvstore header)"
_SAMPLE_TRIES = 4  # random draws tried before a sample gives up (damaged pages in the way)


class DiskTier(IndexedTier):
    """LMDB tier (options: ``path`` (a directory, created), ``map_size``)."""

    name = "disk"
    persistent = True
    verify_reads = True

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
        self._damage = DamagedKeys(self.path)
        self.damage_pending = self._damage.new  # FindsDamage: the same dict, read unlocked
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
            self._write_around(False, disk_writes.put_all, blocks, self._counts,
                               self.capacity_bytes, self._scratch)
        if self._damage.bad:  # a plain test: a put pays nothing while no key is damaged
            self._damage.repaired(blocks)

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Delete ``keys``; a key on a damaged page cannot be (LMDB must read the page to
        delete it) and stays a miss (:mod:`~kvstore.tiers.disk.damage`)."""
        raws = list(dict.fromkeys(self._raws(keys)))
        _, found = self._read_around(disk_writes.stored, raws)
        if not found:
            return  # an empty commit would still cost an fsync
        with self._env.lock:
            self._write_around(True, disk_writes.delete_all, found, self._counts)

    def _write_around(self, stored: bool, body: Callable[..., None],
                      batch: dict[bytes, Any] | list[bytes], *args: Any) -> None:
        """``body(txn, batch, *args)`` committed, without the keys of ``batch`` (a dict or a
        list of encoded keys) that LMDB fails on for damage: each is noted and the
        transaction run again without it, so a damaged key never fails the rest of a batch.
        ``stored``: the keys are stored blocks (a delete's), so one that fails is counted out
        (a put's may be new, and a failed put counted nothing). Caller holds the write
        lock."""
        damaged = self._damage.pages
        if damaged and any(raw in damaged for raw in batch):
            batch = less(batch, damaged)
        while batch:
            try:
                self._env.write(body, batch, *args)
            except PageDamage as hit:
                cause = self._why_unwritable(hit.raw)
                if cause == "disk_write" and not stored:
                    # a key that reads fine but cannot be put: the damage is on a page any
                    # put may need (LMDB's free list), not this key's: a clear error
                    self._damage.note_unkeyed("put", str(hit.error))
                    raise DiskPageError(f"disk tier: write failed on a damaged page: "
                                        f"{hit.error}") from hit
                if self._damage.note(hit.raw, cause, str(hit.error)) and stored:
                    self._counts.hide(hit.raw)
                batch = less(batch, {hit.raw})
                continue
            except DiskPageError as exc:  # a page no key can be blamed for (the commit's)
                self._damage.note_unkeyed("write", str(exc))
                raise
            self._counts.commit()
            return

    # -- reads ----------------------------------------------------------------------------
    def _raws(self, keys: Sequence[BlockKey]) -> list[bytes]:
        prefixes = self._prefixes
        return [prefixes[ns] + block_hash for ns, block_hash in keys]

    def _why_unwritable(self, raw: bytes) -> DamageCause:
        """Whether a key LMDB failed to write or delete is damaged itself (its read fails
        too) or only stands beside a damaged page that the change had to touch."""
        try:
            self._env.read(disk_writes.stored, [raw])
        except (PageDamage, DiskPageError):
            return "disk_page"
        return "disk_write"

    def _read_around(self, body: Callable[..., T], raws: list[bytes],
                     *args: Any) -> tuple[list[bytes], T]:
        """``body(txn, todo, *args)`` in one read transaction and ``todo``: ``raws`` less the
        keys LMDB fails on for damage (those remembered, and each found now: noted, then the
        transaction run again without it)."""
        damaged = self._damage.pages
        todo = without(raws, damaged) if damaged else raws
        while True:
            try:
                return todo, self._env.read(body, todo, *args)
            except PageDamage as hit:
                self._lost(hit)
                todo = without(todo, {hit.raw})

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        # The per-block work is kept to C calls (a cached key prefix, map over txn.get, the
        # batch's headers checked at once, one copy out of the map while the txn is open):
        # at 64 KiB every Python step shows against raw py-lmdb.
        raws = self._raws(keys)
        todo, (out, bad) = self._read_around(disk_writes.read_payloads, raws)
        for i in bad:
            self._damage.note(todo[i], "disk_header", _BAD_HEADER)
        return out if todo is raws else aligned(raws, todo, out)

    def contains(self, key: BlockKey) -> bool:
        return self.metas([key])[0] is not None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.contains(key)

    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        """The meta in each key's header (None: not stored, or not ours), one transaction."""
        raws = self._raws(keys)
        todo, (out, bad) = self._read_around(disk_index.metas, raws)
        for i in bad:
            self._damage.note(todo[i], "disk_header", _BAD_HEADER)
        return out if todo is raws else aligned(raws, todo, out)

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """How many of a chain's ``hashes``, from the first, this tier holds (a key on a
        damaged page ends the run)."""
        prefix = self._prefixes[namespace]
        while True:
            try:
                return self._env.read(disk_index.leading, prefix, hashes, self._damage.pages)
            except PageDamage as hit:
                self._lost(hit)

    def _lost(self, hit: PageDamage) -> None:
        """A read failed on ``hit.raw``'s pages: noted, and out of the counts."""
        if self._damage.note(hit.raw, "disk_page", str(hit.error)):
            with self._env.lock:
                self._counts.hide(hit.raw)

    def take_damaged(self) -> list[tuple[BlockKey, CorruptCause]]:
        """The keys found damaged since the last call, with the cause (for the store to drop
        the blocks and count them as corrupt)."""
        return [(decode_key(raw), cause) for raw, cause in self._damage.take()]

    def damage(self) -> DamageReport:
        """What this tier has found damaged since it opened."""
        return self._damage.report()

    def stats(self) -> dict[str, Any]:
        """The tier's own counters, shown under ``backend`` in the store's stats."""
        return {"damage": asdict(self._damage.report())}

    def keys_of(self, namespace: str) -> list[BlockKey]:
        """Every key of ``namespace``. Around a damaged page (a cursor cannot step over it),
        the keys before it and those after it (read backwards from the last), so that only
        the keys between the first and the last damaged page are left out."""
        prefix = self._prefixes[namespace]
        ahead: list[bytes] = []
        try:
            self._env.read(disk_index.keys_from, prefix, ahead, False)
        except DiskPageError as exc:
            self._damage.note_unkeyed(f"listing namespace {namespace!r}", str(exc))
            behind: list[bytes] = []
            with contextlib.suppress(DiskPageError):
                self._env.read(disk_index.keys_from, prefix, behind, True)
            last = ahead[-1] if ahead else b""
            ahead += [raw for raw in reversed(behind) if raw > last]
        return [decode_key(raw) for raw in ahead]

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` stored keys about at random, or every key when ``n >= len(self)`` (what a
        sampled eviction policy draws its candidates from)."""
        weights = {ns: blocks for ns, (blocks, _) in self._counts.usage().items()}
        if n >= sum(weights.values()):
            return [k for ns in weights for k in self.keys_of(ns)]
        for _ in range(_SAMPLE_TRIES):  # a draw that ran into a damaged page: draw again
            with contextlib.suppress(DiskPageError):
                return self._env.read(disk_index.sample, weights, n, rng)
        return []

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
            "damage": asdict(self._damage.report()),
        }

    def flush(self) -> None:
        self._env.flush()

    def close(self) -> None:
        self._env.close()

