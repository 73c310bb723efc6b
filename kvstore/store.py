"""The store: one index over a stack of tiers, moving blocks between them.

Invariants (checked by :meth:`Store.check_integrity`):
- a key is in tier ``t``'s policy exactly when its index entry has bit ``t`` set;
- every tier's ``used_bytes() <= capacity_bytes``;
- pinned blocks and blocks being read are never evicted;
- a block is returned only if its bytes match the checksum recorded at put time (tiers with
  ``verify_reads``; memory tiers are trusted).

Concurrency: one lock guards the index, policies, leases and memory-tier copies. Reads from
persistent tiers (LMDB, S3) run outside the lock with the entry's ``readers`` count raised so
that the block is not evicted meanwhile; their checksum makes a racing delete harmless.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvstore.checksum import checksum
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import (
    CapacityError,
    InvalidHashError,
    KVStoreError,
    TierUnavailableError,
)
from kvstore.index import BlockIndex, Entry
from kvstore.leases import LeaseTable
from kvstore.namespace import Namespace, NamespaceRegistry
from kvstore.policy import Admission, Policy, make_admission, make_policy
from kvstore.stats import Counters, NamespaceUsage
from kvstore.store_shm import SharedMemoryPath
from kvstore.tiers import Tier, make_tier
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey, LookupResult, PutResult

log = logging.getLogger("kvstore.store")

MAX_HASH_BYTES = 64


class IntegrityError(KVStoreError, AssertionError):
    """The index, the tiers and the policies disagree, or a capacity is exceeded."""


class Store(SharedMemoryPath):
    """Tiered block store. See ``docs/store_api.md`` for the method table; the zero-copy
    host path (``host_slab``, ``acquire_read``, ``reserve_write``...) is in
    :mod:`kvstore.store_shm`."""

    def __init__(self, config: StoreConfig, tiers: Sequence[Tier] | None = None) -> None:
        self.config = config
        self._tcfg: list[TierConfig] = list(config.tiers)
        self._tiers: list[Tier] = list(tiers) if tiers is not None else []
        try:
            if tiers is None:
                for cfg in self._tcfg:
                    self._tiers.append(make_tier(cfg))
            if len(self._tiers) != len(self._tcfg):
                raise ValueError("tiers and config.tiers must have the same length")
        except BaseException:
            for tier in self._tiers:
                tier.close()
            raise
        self._policies: list[Policy] = [make_policy(c.policy) for c in self._tcfg]
        self._admissions: list[Admission] = [make_admission(c.admission) for c in self._tcfg]
        self._names = [t.name for t in self._tiers]
        # name of the top tier for every tier bitmask (None for no tier)
        self._top_name_by_mask: list[str | None] = [None] + [
            self._names[(m & -m).bit_length() - 1] for m in range(1, 1 << len(self._names))
        ]
        # tiers shared with other nodes (S3): consulted for blocks missing from our index
        self._shared: list[Any] = [
            t for t in self._tiers if getattr(t, "discover", None) is not None
        ]
        self._lock = threading.RLock()
        self._index = BlockIndex()
        self._leases = LeaseTable()
        # shm writes in flight: key -> (owner, lease expiry, host-slab extents)
        self._reservations: dict[BlockKey, tuple[str, float, list[tuple[int, int]]]] = {}
        self._namespaces = NamespaceRegistry()
        self._tier_stats = [Counters() for _ in self._tiers]
        self._ns_stats: dict[str, Counters] = {}
        self._ns_usage: dict[str, NamespaceUsage] = {}
        self._totals = Counters()
        self._closed = False
        self._prefetcher = ThreadPoolExecutor(
            max_workers=config.prefetch_workers, thread_name_prefix="kvstore-prefetch"
        )
        self._load_namespaces()
        self._rebuild_index()

    @classmethod
    def open(cls, config: StoreConfig) -> Store:
        return cls(config)

    # -- namespaces ---------------------------------------------------------------------------
    def register_namespace(self, ns: Namespace) -> bool:
        """Register ``ns``; True if new, False if an identical one exists. Raises
        :class:`~kvstore.errors.NamespaceConflictError` on a differing definition."""
        with self._lock:
            new = self._namespaces.register(ns)
            if new:
                self._ns_stats.setdefault(ns.name, Counters())
                self._ns_usage.setdefault(ns.name, NamespaceUsage())
                self._save_namespaces()
            return new

    def namespace(self, name: str) -> Namespace:
        with self._lock:
            return self._namespaces.get(name)

    def namespaces(self) -> list[Namespace]:
        with self._lock:
            return self._namespaces.all()

    # -- data path ----------------------------------------------------------------------------
    def put(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        blocks: Sequence[Buffer],
        *,
        tier: str | None = None,
    ) -> PutResult:
        """Store blocks (each exactly the namespace's ``block_bytes``) in the top tier, or in
        ``tier``. Blocks already stored are left as they are (``existing``). Blocks that no tier
        can take, because everything evictable is pinned, are ``refused``. Raises on a bad
        namespace, size or hash before storing anything."""
        ns = self.namespace(namespace)
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes but {len(blocks)} blocks")
        keys = self._keys(namespace, hashes)
        for block in blocks:
            ns.check_size(memoryview(block).nbytes)
        sums = [checksum(b) for b in blocks]  # outside the lock: the costly part of a put
        start = self._tier_pos(tier) if tier is not None else 0
        stored = existing = refused = 0
        with self._lock:
            self._check_open()
            fresh: list[tuple[BlockKey, Buffer, BlockMeta]] = []
            seen: set[BlockKey] = set()
            for key, block, csum in zip(keys, blocks, sums, strict=True):
                for adm in self._admissions:
                    adm.on_access(key)
                entry = self._index.get(key)
                if (entry is not None and not entry.pending) or key in seen:
                    existing += 1
                    if tier is not None and entry is not None and not entry.tiers >> start:
                        # asked for a lower (durable) tier that holds no copy yet: add one
                        self._copy_down(key, entry, block, csum, start)
                    continue
                if entry is not None:  # reserved by a shm writer that has not committed
                    refused += 1
                    continue
                seen.add(key)
                fresh.append((key, block, BlockMeta(ns.layout_id, csum, ns.block_bytes)))
            rest = fresh if (start > 0 and not all(
                self._admissions[start].admit(k) for k, _, _ in fresh
            )) else self._place_batch(fresh, start)
            stored += len(fresh) - len(rest)
            for item in rest:  # one by one: each may land in a different tier
                if self._place(item, start):
                    stored += 1
                else:
                    refused += 1
                    self._ns_counters(namespace).dropped += 1
        return PutResult(stored, existing, refused)

    def get(
        self, namespace: str, hashes: Sequence[bytes], *, promote: bool | None = None
    ) -> list[bytes | None]:
        """Bytes of each block, or None for a miss (absent, or dropped because its checksum
        failed). A hit from a lower tier is copied to the top tier when ``promote`` (default:
        the config's ``promote_on_hit``)."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        do_promote = self.config.promote_on_hit if promote is None else promote
        out = self._read(keys, promote=do_promote, count=True)
        return out

    def contains(self, namespace: str, block_hash: bytes) -> bool:
        key = self._keys(namespace, [block_hash])[0]
        with self._lock:
            entry = self._index.get(key)
            return entry is not None and not entry.pending and entry.tiers != 0

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> LookupResult:
        """Longest prefix of ``hashes`` that is stored, and the top tier of each block in it.
        No side effects on recency, leases or stats."""
        self.namespace(namespace)
        # The hot loop of routing decisions: one dict.get and one list index per block. Only
        # bytes are ever indexed, so a hit proves its hash valid; the tail after the first
        # miss is validated below.
        by_mask = self._top_name_by_mask
        tiers: list[str] = []
        append = tiers.append
        with self._lock:
            get = self._index.namespace(namespace).get
            try:
                for h in hashes:
                    entry = get(h)
                    if entry is None:
                        break
                    name = by_mask[entry.tiers]
                    if name is None:  # pending shm write: not visible yet
                        break
                    append(name)
            except TypeError:  # an unhashable "hash"
                pass
        n = len(tiers)
        if n < len(hashes):
            if _check_hashes(hashes[n:]):
                return self.lookup(namespace, [bytes(h) for h in hashes])
            if self._shared and self._discover(self._keys(namespace, hashes[n:]), prefix=True):
                return self.lookup(namespace, hashes)
        return LookupResult(n, tiers)

    def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """Remove blocks from every tier, pinned or not. Returns how many existed."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        deleted = 0
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                if entry is None or entry.pending:
                    continue
                for pos in entry.positions():
                    self._remove_from(pos, key, entry)
                self._drop_entry(key, entry)
                self._leases.forget(key)
                for adm in self._admissions:
                    adm.forget(key)
                deleted += 1
        return deleted

    def prefetch(self, namespace: str, hashes: Sequence[bytes]) -> Future[int]:
        """Start onboarding the blocks toward the top tier. The future resolves to the number
        of requested blocks resident in the top tier when it finished."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        return self._prefetcher.submit(self._prefetch, keys)

    # -- pins ---------------------------------------------------------------------------------
    def pin(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        *,
        lease_s: float | None = None,
        owner: str = "",
    ) -> list[bool]:
        """Pin existing blocks for ``lease_s`` seconds (renewed by pinning again). True where
        the block exists and is now pinned."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        lease = self._lease(lease_s)
        out: list[bool] = []
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                ok = entry is not None and not entry.pending and entry.tiers != 0
                if ok:
                    self._leases.pin(key, owner, lease)
                out.append(ok)
        return out

    def release(self, namespace: str, hashes: Sequence[bytes], *, owner: str = "") -> int:
        keys = self._keys(namespace, hashes)
        with self._lock:
            return sum(self._leases.release(key, owner) for key in keys)

    def expire_leases(self, owner: str | None = None) -> int:
        """Drop expired pins and reservations, or all of ``owner``'s when given."""
        with self._lock:
            dropped = self._leases.expire(owner)
            now = _now()
            for key, (who, expiry, _) in list(self._reservations.items()):
                if (owner is not None and who == owner) or expiry <= now:
                    self._unreserve(key)
                    dropped += 1
            return dropped

    # -- observability ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            tiers = {}
            for pos, tier in enumerate(self._tiers):
                doc = self._tier_stats[pos].as_dict()
                doc.update(
                    blocks=len(self._policies[pos]),
                    bytes=tier.used_bytes(),
                    capacity_bytes=tier.capacity_bytes,
                    occupancy=tier.used_bytes() / tier.capacity_bytes,
                    policy=self._tcfg[pos].policy,
                )
                # tier-specific counters (S3: pending uploads, drops, errors) under "backend"
                backend = getattr(tier, "stats", None)
                if backend is not None:
                    doc["backend"] = backend()
                tiers[self._names[pos]] = doc
            capacity = sum(t.capacity_bytes for t in self._tiers)
            namespaces = {}
            for name in self._namespaces_names():
                doc = self._ns_counters(name).as_dict()
                usage = self._ns_usage.setdefault(name, NamespaceUsage())
                # namespaces share the tiers: each may grow to the whole capacity
                doc.update(blocks=usage.blocks, bytes=usage.bytes, capacity_bytes=capacity)
                namespaces[name] = doc
            totals = self._totals.as_dict()
            totals.update(
                blocks=sum(u.blocks for u in self._ns_usage.values()),
                bytes=sum(u.bytes for u in self._ns_usage.values()),
                capacity_bytes=capacity,
                pinned=len(self._leases),
            )
            return {"totals": totals, "tiers": tiers, "namespaces": namespaces}

    def health(self) -> dict[str, Any]:
        tiers: dict[str, Any] = {}
        ok = not self._closed
        for tier in self._tiers:
            try:
                doc = dict(tier.health())
            except Exception as exc:  # a health probe must never take the server down
                doc = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            tiers[tier.name] = doc
            # the shared S3 tier degrades the store but does not stop it from serving
            if not doc.get("ok", False) and tier.name != "s3":
                ok = False
        return {"ok": ok, "tiers": tiers}

    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` if the index, tiers and policies disagree."""
        with self._lock:
            for pos, tier in enumerate(self._tiers):
                name = self._names[pos]
                if tier.used_bytes() > tier.capacity_bytes:
                    raise IntegrityError(
                        f"{name}: {tier.used_bytes()} bytes used > capacity {tier.capacity_bytes}"
                    )
                resident = [k for k, e in self._index.items() if e.holds(pos)]
                policy = self._policies[pos]
                if len(resident) != len(policy):
                    raise IntegrityError(
                        f"{name}: index holds {len(resident)} blocks, policy tracks {len(policy)}"
                    )
                for key in resident:
                    if key not in policy:
                        raise IntegrityError(f"{name}: {_fmt(key)} indexed, not in policy")
                    if tier.name != "s3" and not tier.contains(key):
                        raise IntegrityError(f"{name}: {_fmt(key)} indexed, not in tier")
            usage: dict[str, list[int]] = {}
            for key, entry in self._index.items():
                if entry.pending:
                    if key not in self._reservations:
                        raise IntegrityError(f"{_fmt(key)} pending without a reservation")
                    continue
                if not entry.tiers:
                    raise IntegrityError(f"{_fmt(key)} indexed in no tier")
                counted = usage.setdefault(key[0], [0, 0])
                counted[0] += 1
                counted[1] += entry.size
            for name, have in self._ns_usage.items():
                want = usage.get(name, [0, 0])
                if [have.blocks, have.bytes] != want:
                    raise IntegrityError(
                        f"namespace {name}: counted {have.blocks} blocks/{have.bytes} bytes, "
                        f"index has {want[0]}/{want[1]}"
                    )
            for tier in self._tiers:
                check = getattr(tier, "check_integrity", None)  # slab tiers: slot ownership
                if check is not None:
                    try:
                        check()
                    except RuntimeError as exc:
                        raise IntegrityError(f"{tier.name}: {exc}") from exc
            for key in self._leases.pinned_keys():
                if key not in self._index:
                    raise IntegrityError(f"{_fmt(key)} pinned but not indexed")

    def tier_names(self) -> list[str]:
        return list(self._names)

    def tier(self, name: str) -> Tier:
        return self._tiers[self._tier_pos(name)]

    def flush(self) -> None:
        with self._lock:
            for tier in self._tiers:
                tier.flush()

    def close(self) -> None:
        """Stop prefetching, flush and close every tier. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._prefetcher.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for key in list(self._reservations):
                self._unreserve(key)
            if self.config.spill_on_close:
                self._spill()
            for tier in self._tiers:
                try:
                    tier.close()
                except Exception:
                    log.exception("closing the %s tier failed", tier.name)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals: placement and eviction (call with the lock held) --------------------------
    def _place_batch(
        self, items: list[tuple[BlockKey, Buffer, BlockMeta]], pos: int
    ) -> list[tuple[BlockKey, Buffer, BlockMeta]]:
        """Store a whole batch in tier ``pos`` with one ``put_many`` (the common case: the
        top tier makes room by demoting). Returns the items it did not store: all of them if
        the batch does not fit as a whole."""
        if not items or not self._write(pos, items):
            return items
        bit = 1 << pos
        for key, _, meta in items:
            self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id, tiers=bit)
            self._track(pos, key, meta.size)
            usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
            usage.blocks += 1
            usage.bytes += meta.size
        for low in range(pos + 1, len(self._tiers)):
            if not self._tcfg[low].write_through:
                continue
            down = [it for it in items if self._admissions[low].admit(it[0])]
            if down and self._write(low, down):
                for key, _, meta in down:
                    entry = self._index.get(key)
                    if entry is not None:
                        entry.tiers |= 1 << low
                        self._track(low, key, meta.size)
                    else:  # cannot happen today (a batch key always keeps its pos copy)
                        self._tiers[low].delete([key])
                self._settle(low)
        self._settle(pos)
        return []

    def _place(self, item: tuple[BlockKey, Buffer, BlockMeta], start: int) -> bool:
        """Store a new block in the first tier at or below ``start`` that admits it and can make
        room; also into write-through tiers below. False if no tier could take it."""
        key, data, meta = item
        for pos in range(start, len(self._tiers)):
            if pos > start and not self._admissions[pos].admit(key):
                continue
            if self._write(pos, [item]):
                entry = Entry(meta.size, meta.checksum, meta.layout_id, tiers=1 << pos)
                self._index[key] = entry
                self._track(pos, key, meta.size)
                usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                usage.blocks += 1
                usage.bytes += meta.size
                self._write_through(pos, key, data, meta, entry)
                self._settle(pos)
                return True
        return False

    def _copy_down(self, key: BlockKey, entry: Entry, data: Buffer, csum: int, pos: int) -> None:
        """Give an existing block a copy in tier ``pos`` (a put that names a tier, such as a
        durable put to disk, of a block that memory tiers hold). The caller's bytes are used
        only if they are the bytes we hold."""
        if csum != entry.checksum:
            top = self._tiers[entry.top()].get_many([key])[0]
            if top is None or checksum(top) != entry.checksum:
                return
            data = top
        if self._write(pos, [(key, data, BlockMeta(entry.layout_id, entry.checksum, entry.size))]):
            entry.tiers |= 1 << pos
            self._track(pos, key, entry.size)
            self._settle(pos)

    def _write_through(
        self, pos: int, key: BlockKey, data: Buffer, meta: BlockMeta, entry: Entry
    ) -> None:
        for low in range(pos + 1, len(self._tiers)):
            if self._tcfg[low].write_through and self._admissions[low].admit(key) \
                    and self._write(low, [(key, data, meta)]):
                entry.tiers |= 1 << low
                self._track(low, key, meta.size)
                self._settle(low)

    def _write(self, pos: int, items: list[tuple[BlockKey, Buffer, BlockMeta]]) -> bool:
        """Make room in tier ``pos`` and write ``items``; False if it cannot."""
        tier = self._tiers[pos]
        need = sum(tier.charge(m.size) for _, _, m in items)
        if need > tier.capacity_bytes or not self._make_room(pos, need):
            return False
        try:
            tier.put_many(items)
        except (CapacityError, TierUnavailableError) as exc:
            log.warning("%s tier refused %d blocks: %s", tier.name, len(items), exc)
            return False
        return True

    def _make_room(self, pos: int, need: int) -> bool:
        """Evict from tier ``pos`` until ``need`` more bytes fit under its capacity."""
        tier = self._tiers[pos]
        while tier.used_bytes() + need > tier.capacity_bytes:
            if not self._evict(pos, tier.used_bytes() + need - tier.capacity_bytes):
                return False
        return True

    def _settle(self, pos: int) -> None:
        """Past the high watermark, evict down to the low watermark."""
        tier, cfg = self._tiers[pos], self._tcfg[pos]
        if tier.used_bytes() > cfg.high_watermark * tier.capacity_bytes:
            self._evict(pos, tier.used_bytes() - int(cfg.low_watermark * tier.capacity_bytes))

    def _evict(self, pos: int, nbytes: int) -> bool:
        """Move victims out of tier ``pos`` until ``nbytes`` are freed. False if none could be
        evicted (everything resident is pinned or being read)."""
        tier, policy = self._tiers[pos], self._policies[pos]
        freed = 0
        while freed < nbytes:
            victims = policy.victims(8, self._evictable)
            if not victims:
                return freed > 0
            for key in victims:
                entry = self._index[key]
                before = tier.used_bytes()
                self._demote(pos, key, entry)
                freed += before - tier.used_bytes()
                if freed >= nbytes:
                    break
        return True

    def _demote(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Take ``key`` out of tier ``pos``: keep it in a lower tier (copying it down if no
        lower tier holds it yet and one admits it), else drop it from the store."""
        stats = self._tier_stats[pos]
        stats.evictions += 1
        lower = entry.tiers >> (pos + 1)
        if not lower:
            for low in range(pos + 1, len(self._tiers)):
                if not self._admissions[low].admit(key):
                    continue
                data = self._tiers[pos].get_many([key])[0]
                if data is None:
                    break
                meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
                if self._write(low, [(key, data, meta)]):
                    entry.tiers |= 1 << low
                    self._track(low, key, entry.size)
                    stats.demotions += 1
                    self._ns_counters(key[0]).demotions += 1
                    self._totals.demotions += 1
                    self._settle(low)
                    break
        self._remove_from(pos, key, entry)
        if not entry.tiers:
            self._drop_entry(key, entry)
            self._ns_counters(key[0]).evictions += 1
            self._ns_counters(key[0]).dropped += 1
            self._totals.evictions += 1
            self._totals.dropped += 1

    def _evictable(self, key: BlockKey) -> bool:
        entry = self._index.get(key)
        if entry is None or entry.readers:
            return False
        return not self._leases.is_pinned(key)

    def _track(self, pos: int, key: BlockKey, size: int) -> None:
        self._policies[pos].on_put(key, size)

    def _remove_from(self, pos: int, key: BlockKey, entry: Entry) -> None:
        self._tiers[pos].delete([key])
        self._policies[pos].on_remove(key)
        entry.tiers &= ~(1 << pos)

    def _drop_entry(self, key: BlockKey, entry: Entry) -> None:
        """Forget a block that no tier holds any more."""
        for pos in entry.positions():
            self._remove_from(pos, key, entry)
        if self._index.pop(key, None) is not None:
            usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
            usage.blocks -= 1
            usage.bytes -= entry.size
        self._leases.forget(key)

    def _spill(self) -> None:
        """Graceful shutdown: copy blocks that only memory tiers hold into the first persistent
        tier, so that a restart finds them. Admission is not asked: these blocks earned their
        place in memory already."""
        target = next(
            (p for p, t in enumerate(self._tiers)
             if t.persistent and getattr(t, "discover", None) is None),
            None,
        )
        if target is None:
            return
        for key, entry in list(self._index.items()):
            if entry.pending or entry.tiers >> target or not entry.tiers:
                continue
            data = self._tiers[entry.top()].get_many([key])[0]
            if data is None:
                continue
            meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
            if self._write(target, [(key, data, meta)]):
                entry.tiers |= 1 << target
                self._track(target, key, entry.size)
        self._tiers[target].flush()

    # -- internals: reads ---------------------------------------------------------------------
    def _read(
        self, keys: list[BlockKey], *, promote: bool, count: bool, promote_to: int = 0
    ) -> list[bytes | None]:
        """Read blocks from their top tier, verify, promote (copy up into tier
        ``promote_to``). Persistent tiers are read outside the lock, one batched call per
        tier."""
        out: list[bytes | None] = [None] * len(keys)
        served_by: list[int] = [-1] * len(keys)
        missing = [i for i, k in enumerate(keys) if k not in self._index]
        if missing:
            self._discover([keys[i] for i in missing])
        with self._lock:
            self._check_open()
            slow: dict[int, list[int]] = {}
            reading: list[Entry] = []
            for i, key in enumerate(keys):
                entry = self._index.get(key)
                if entry is None or entry.pending or not entry.tiers:
                    continue
                pos = entry.top()
                if self._tiers[pos].persistent:
                    entry.readers += 1
                    reading.append(entry)
                    slow.setdefault(pos, []).append(i)
                else:
                    out[i] = self._tiers[pos].get_many([key])[0]
                    served_by[i] = pos if out[i] is not None else -1
        for pos, idxs in slow.items():
            try:
                datas = self._tiers[pos].get_many([keys[i] for i in idxs])
            except Exception as exc:  # a failing back end is a miss, never an error to callers
                log.warning("%s tier read failed: %s", self._names[pos], exc)
                datas = [None] * len(idxs)
            for i, data in zip(idxs, datas, strict=True):
                out[i] = data
                served_by[i] = pos
        with self._lock:
            for entry in reading:
                entry.readers -= 1
            entries: list[Entry | None] = [None] * len(keys)
            for i, key in enumerate(keys):
                pos = served_by[i]
                if pos < 0:
                    continue
                entry = entries[i] = self._index.get(key)
                data = out[i]
                if data is None and entry is not None and entry.holds(pos) \
                        and not self._tiers[pos].contains(key):
                    # the tier lost it behind our back (an S3 upload dropped after retries,
                    # an object deleted by another node): forget that copy
                    self._remove_from(pos, key, entry)
                    if not entry.tiers:
                        self._drop_entry(key, entry)
                        self._ns_counters(key[0]).dropped += 1
                        self._totals.dropped += 1
                # a persistent-tier read ran unlocked: the block may have left meanwhile
                # (memory-tier reads ran under the lock and are valid as read)
                left = self._tiers[pos].persistent and (entry is None or not entry.holds(pos))
                if entry is None or data is None or left:
                    out[i], served_by[i] = None, -1
                    continue
                if self._tiers[pos].verify_reads and checksum(data) != entry.checksum:
                    self._corrupt(pos, key, entry)
                    out[i], served_by[i] = None, -1
            # promotions come last: they may evict blocks this same call just read
            for i, key in enumerate(keys):
                pos, entry, data = served_by[i], entries[i], out[i]
                if pos < 0 or entry is None or data is None:
                    continue
                self._policies[pos].on_hit(key)
                if count:
                    for adm in self._admissions:
                        adm.on_access(key)
                if promote and pos > promote_to:
                    self._promote(key, entry, data, promote_to)
            if count:
                self._count_reads(keys, served_by, out)
        return out

    def _promote(self, key: BlockKey, entry: Entry, data: bytes, to: int = 0) -> None:
        """Copy a block read from a lower tier into tier ``to`` (the lower copy stays)."""
        # an earlier promotion in the same batch may have cascaded into evicting this block
        if entry.holds(to) or self._index.get(key) is not entry:
            return
        meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
        if self._write(to, [(key, data, meta)]):
            entry.tiers |= 1 << to
            self._track(to, key, entry.size)
            self._tier_stats[to].promotions += 1
            self._ns_counters(key[0]).promotions += 1
            self._totals.promotions += 1
            self._settle(to)

    def _corrupt(self, pos: int, key: BlockKey, entry: Entry) -> None:
        log.error("checksum mismatch for %s in the %s tier: dropped", _fmt(key), self._names[pos])
        self._remove_from(pos, key, entry)
        if not entry.tiers:
            self._drop_entry(key, entry)
        self._tier_stats[pos].corrupt_dropped += 1
        self._ns_counters(key[0]).corrupt_dropped += 1
        self._totals.corrupt_dropped += 1

    def _count_reads(
        self, keys: list[BlockKey], served_by: list[int], out: list[bytes | None]
    ) -> None:
        for key, pos, data in zip(keys, served_by, out, strict=True):
            hit = data is not None
            ns = self._ns_counters(key[0])
            for c in (ns, self._totals):
                c.queries += 1
                c.hits += hit
                c.misses += not hit
            # each tier above the serving one was asked and missed
            last = pos if hit else len(self._tiers) - 1
            for p in range(last + 1):
                t = self._tier_stats[p]
                t.queries += 1
                served = hit and p == pos
                t.hits += served
                t.misses += not served

    def _prefetch(self, keys: list[BlockKey]) -> int:
        with self._lock:
            todo = [
                k for k in keys
                if (e := self._index.get(k)) is not None and e.tiers and not e.holds(0)
            ]
        if todo:
            datas = self._read(todo, promote=True, count=False)
            with self._lock:
                got = sum(d is not None for d in datas)
                self._tier_stats[0].prefetched += got
                self._totals.prefetched += got
        with self._lock:
            return sum(
                1 for k in keys if (e := self._index.get(k)) is not None and e.holds(0)
            )

    def _discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> bool:
        """Ask shared tiers (those with ``discover``, i.e. S3) about keys missing from the
        index, and index what they hold. With ``prefix`` the keys are a hash chain and the
        tier may stop asking after the first miss. True if anything was found."""
        found = False
        for tier in self._shared:
            pos = self._tiers.index(tier)
            try:
                metas = tier.discover(list(keys), prefix=prefix)
            except Exception as exc:
                log.warning("%s discover failed: %s", tier.name, exc)
                continue
            with self._lock:
                for key, meta in zip(keys, metas, strict=True):
                    if meta is None or key in self._index or key[0] not in self._namespaces:
                        continue
                    if meta.layout_id != self._namespaces.get(key[0]).layout_id:
                        continue
                    self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id, 1 << pos)
                    self._track(pos, key, meta.size)
                    usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                    usage.blocks += 1
                    usage.bytes += meta.size
                    found = True
        return found

    # -- internals: startup and persistence ---------------------------------------------------
    def _rebuild_index(self) -> None:
        """Index every block persistent tiers hold (restart). Blocks whose layout id does not
        match their registered namespace are skipped: they belong to another definition."""
        for pos, tier in enumerate(self._tiers):
            if not tier.persistent or getattr(tier, "discover", None) is not None:
                continue  # shared tiers are discovered on demand, not listed at start
            for key, meta in tier.scan():
                ns = self._namespaces.get(key[0]) if key[0] in self._namespaces else None
                if ns is not None and meta.layout_id != ns.layout_id:
                    log.warning("skipping %s: layout id differs from its namespace", _fmt(key))
                    continue
                entry = self._index.get(key)
                if entry is None:
                    entry = self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id)
                    usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                    usage.blocks += 1
                    usage.bytes += meta.size
                entry.tiers |= 1 << pos
                self._track(pos, key, meta.size)

    def _load_namespaces(self) -> None:
        path = self.config.namespaces_path
        if not path or not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as fh:
            for doc in json.load(fh):
                ns = Namespace.from_dict(doc)
                self._namespaces.register(ns)
                self._ns_stats.setdefault(ns.name, Counters())
                self._ns_usage.setdefault(ns.name, NamespaceUsage())

    def _save_namespaces(self) -> None:
        path = self.config.namespaces_path
        if not path:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump([ns.to_dict() for ns in self._namespaces.all()], fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: a crash leaves the old or the new file, never half

    # -- small helpers ------------------------------------------------------------------------
    def _keys(self, namespace: str, hashes: Sequence[bytes]) -> list[BlockKey]:
        _check_hashes(hashes)
        return [(namespace, bytes(h)) for h in hashes]

    def _tier_pos(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(
                f"unknown tier {name!r}; this store has: {', '.join(self._names)}"
            ) from None

    def _ns_counters(self, name: str) -> Counters:
        return self._ns_stats.setdefault(name, Counters())

    def _namespaces_names(self) -> list[str]:
        return sorted(set(self._ns_stats) | set(self._ns_usage))

    def _lease(self, lease_s: float | None) -> float:
        lease = self.config.default_lease_s if lease_s is None else float(lease_s)
        if not lease > 0:
            raise ValueError(f"lease_s must be positive, got {lease_s!r}")
        return lease

    def _unreserve(self, key: BlockKey) -> None:
        self._reservations.pop(key, None)
        entry = self._index.get(key)
        if entry is not None and entry.pending:
            del self._index[key]
            host = self._host_pos()
            if host is not None:
                self._tiers[host].unreserve(key)  # type: ignore[attr-defined]

    def _host_pos(self) -> int | None:
        return self._names.index("host") if "host" in self._names else None

    def _check_open(self) -> None:
        if self._closed:
            raise KVStoreError("the store is closed")


def _check_hashes(hashes: Sequence[bytes]) -> bool:
    """Validate a batch of hashes with C-level passes (no Python loop per hash). True if
    some are bytearrays (unhashable: the caller converts them)."""
    if not hashes:
        return False
    types = set(map(type, hashes))
    if not types <= {bytes, bytearray}:
        bad = next(h for h in hashes if not isinstance(h, bytes | bytearray))
        raise InvalidHashError(f"block hash must be bytes, got {type(bad).__name__}")
    lengths = set(map(len, hashes))
    if min(lengths) < 1 or max(lengths) > MAX_HASH_BYTES:
        raise InvalidHashError(f"block hash must be 1-{MAX_HASH_BYTES} bytes, got lengths "
                               f"{sorted(lengths)}")
    return bytearray in types


def _now() -> float:
    return time.monotonic()


def _fmt(key: BlockKey) -> str:
    return f"{key[0]}/{key[1].hex()}"
