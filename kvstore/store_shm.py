"""The store's zero-copy path for clients on the same host.

The host tier's slab lives in named shared memory. A local client asks the store for byte
extents inside it and copies block bytes itself, so only control messages cross a socket:

- read: :meth:`acquire_read` makes each block resident in the host tier, pins it under a lease
  and returns its extents; the client copies, then calls ``release``.
- write: :meth:`reserve_write` allocates host slots for blocks the store does not have yet
  (invisible to every reader); the client copies into them, then :meth:`commit_write`
  publishes them, or :meth:`abort_write` frees them. A reservation whose lease runs out is
  freed, so a client that dies mid-write leaves nothing behind.

Commit does not checksum: like every block that only memory tiers hold, a committed block is
hashed when it first goes to disk or S3. The slab is mapped writable by local clients, so a
client that writes into a block after committing it changes what is later stored; local
clients are trusted with the host tier's memory either way (they could overwrite any slot).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from kvstore.errors import CapacityError, KVStoreError, WouldBlock
from kvstore.index import Entry
from kvstore.stats import NamespaceUsage
from kvstore.store_read import Reads
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.slab import SlabInfo, SlabTier
from kvstore.types import BlockKey, PutResult

Extents = list[tuple[int, int]]


class SharedMemoryPath(Reads):
    """Mixin of :class:`kvstore.store.Store`; uses its lock, index and tiers."""

    def host_slab(self) -> SlabInfo | None:
        """``SlabInfo(shm_name, size, slot_bytes)`` of the host tier, or None without one."""
        pos = self._host_pos()
        return None if pos is None else self._slab(pos).slab_info()

    def acquire_read(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        *,
        lease_s: float | None = None,
        owner: str = "",
        nowait: bool = False,
        promote: bool = True,
    ) -> list[Extents | None]:
        """Extents in the host slab of each block (None for a miss), each pinned for
        ``lease_s`` under ``owner``: copy the bytes, then ``release`` them. Blocks in lower
        tiers are promoted into the host tier first. Counts as a get in the stats. With
        ``nowait``, raises :class:`~kvstore.errors.WouldBlock` rather than wait for the lock
        or promote (read a lower tier). With ``promote=False`` only blocks the host tier holds
        now are served: the others get None (and are not counted), however many are stored
        below."""
        host = self._require_host()
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        lease = self._lease(lease_s)
        out: list[Extents | None] = [None] * len(keys)
        below: list[BlockKey] = []
        if promote:
            with self._hold(nowait):
                below = [
                    k for k in keys
                    if (e := self._index.get(k)) is not None and e.tiers and not e.holds(host)
                ]
        if below:
            if nowait:
                raise WouldBlock(f"{len(below)} blocks must be promoted from a lower tier")
            self._read(below, promote=True, count=False, promote_to=host)
        with self._hold(nowait):
            entries = [self._index.get(key) for key in keys]
            stuck = promote and sum(
                e is not None and e.tiers != 0 and not e.holds(host) for e in entries
            )
            if stuck:  # stored, but the host tier could not take it: not a miss
                raise CapacityError(
                    f"{stuck} stored blocks could not be staged in the host tier: it is full "
                    "of pinned blocks; release pins or read fewer blocks at once"
                )
            served: list[int] = []
            for i, (key, entry) in enumerate(zip(keys, entries, strict=True)):
                ok = entry is not None and not entry.pending and entry.holds(host)
                served.append(host if ok else -1)
                if ok:
                    self._leases.pin(key, owner, lease)
                    self._policies[host].on_hit(key)
                    out[i] = self._slab(host).extents(key)
            found: list[bytes | None] = [b"" if e is not None else None for e in out]
            if not promote:  # only what was served was read
                keys = [k for k, pos in zip(keys, served, strict=True) if pos >= 0]
                served, found = [host] * len(keys), [b""] * len(keys)
            self._count_reads(keys, served, found)
        return out

    def reserve_write(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        *,
        lease_s: float | None = None,
        owner: str = "",
        nowait: bool = False,
    ) -> list[Extents | None]:
        """Host-slab extents to write each new block into; None where the store already has
        the block (or another writer reserved it): skip those. Raises
        :class:`~kvstore.errors.CapacityError` if the host tier cannot make room, and with
        ``nowait`` :class:`~kvstore.errors.WouldBlock` rather than wait for the lock or evict."""
        host = self._require_host()
        ns = self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        expiry = time.monotonic() + self._lease(lease_s)
        tier = self._slab(host)
        with self._hold(nowait):
            self._check_open()
            fresh = list(dict.fromkeys(k for k in keys if k not in self._index))
            need = tier.charge(ns.block_bytes) * len(fresh)
            if nowait and tier.used_bytes() + need > tier.capacity_bytes:
                raise WouldBlock("the host tier must evict to make room")
            if not self._make_room(host, need):
                raise CapacityError(
                    f"host tier has no room for {len(fresh)} blocks: everything resident is "
                    "pinned or being read"
                )
            extents = tier.reserve_many([(k, ns.block_bytes) for k in fresh])
            for key, ext in zip(fresh, extents, strict=True):
                self._index[key] = Entry(ns.block_bytes, None, ns.layout_id, pending=True)
                self._reservations[key] = (owner, expiry, ext)
            where = dict(zip(fresh, extents, strict=True))
        return [where.pop(k, None) for k in keys]  # a key asked twice is written once

    def commit_write(
        self, namespace: str, hashes: Sequence[bytes], *, owner: str = "", nowait: bool = False
    ) -> PutResult:
        """Publish blocks this owner reserved and wrote. Keys it did not reserve count as
        ``existing`` if stored, else ``refused``. With ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` (publishing nothing) rather than wait for the lock,
        copy to a write-through tier or evict past the high watermark."""
        host = self._require_host()
        keys = self._keys(namespace, hashes)
        existing = refused = 0
        through = self._writes_through(host)
        with self._hold(nowait):
            if nowait and self._commit_blocked(host):
                raise WouldBlock("the commit must copy or evict to a lower tier")
            mine: list[BlockKey] = []
            seen: set[BlockKey] = set()
            for key in keys:
                if key in seen:  # the same block twice in one batch: written once
                    existing += 1
                    continue
                seen.add(key)
                held = self._reservations.get(key)
                if held is None or held[0] != owner:
                    entry = self._index.get(key)
                    if entry is not None and not entry.pending:
                        existing += 1
                    else:
                        refused += 1
                    continue
                mine.append(key)
            self._publish(host, mine, through)
        return PutResult(len(mine), existing, refused)

    def _publish(self, host: int, keys: list[BlockKey], through: bool) -> None:
        """Make reserved, written blocks visible in the host tier (lock held)."""
        tier = self._slab(host)
        tier.publish_many(keys)
        for key in keys:
            del self._reservations[key]
            entry = self._index[key]
            entry.pending = False
            entry.tiers = 1 << host
            self._track(host, key, entry.size)
            for adm in self._admissions:
                adm.on_access(key)
            usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
            usage.blocks += 1
            usage.bytes += entry.size
        for key in keys if through else ():  # copies only when a tier below wants them
            entry = self._index[key]
            data = tier.read(key)
            self._write_through(
                host, key, data, BlockMeta(entry.layout_id, entry.checksum, entry.size), entry
            )
        self._settle(host)

    def _commit_blocked(self, host: int) -> bool:
        """Whether a commit now would copy to a write-through tier or evict (I/O)."""
        tier = self._slab(host)
        return self._writes_through(host) or \
            tier.used_bytes() > self._tcfg[host].high_watermark * tier.capacity_bytes

    def _writes_through(self, host: int) -> bool:
        """Whether a tier below the host tier takes a copy of every new block."""
        return any(c.write_through for c in self._tcfg[host + 1:])

    def abort_write(self, namespace: str, hashes: Sequence[bytes], *, owner: str = "") -> int:
        """Free this owner's reservations for ``hashes``. Returns how many were freed."""
        keys = self._keys(namespace, hashes)
        freed = 0
        with self._lock:
            for key in keys:
                held = self._reservations.get(key)
                if held is not None and held[0] == owner:
                    self._unreserve(key)
                    freed += 1
        return freed

    def _slab(self, pos: int) -> SlabTier:
        return cast(SlabTier, self._tiers[pos])  # the host tier is always a slab tier

    def _require_host(self) -> int:
        pos = self._host_pos()
        if pos is None:
            raise KVStoreError("this store has no host tier: the shared-memory path is off")
        return int(pos)
