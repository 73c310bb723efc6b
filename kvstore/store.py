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

import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kvstore.checksum import checksum
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import WouldBlock
from kvstore.index import BlockIndex, Entry
from kvstore.leases import LeaseTable
from kvstore.namespace import NamespaceRegistry
from kvstore.policy import Admission, Policy, make_admission, make_policy
from kvstore.stats import Counters, NamespaceUsage
from kvstore.store_core import check_hashes, fmt_key
from kvstore.store_namespaces import Namespaces
from kvstore.store_pins import Pinning
from kvstore.store_report import IntegrityError as IntegrityError  # re-exported
from kvstore.store_report import Reports
from kvstore.store_stage import Staged
from kvstore.tiers import Tier, make_tier
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey, LookupResult, PutResult

log = logging.getLogger("kvstore.store")
RETIRED_NS = "\x00retired"  # placeholder keys of deleted blocks' slots; no namespace has NUL


class Store(Pinning, Namespaces, Reports):
    """Tiered block store. See ``docs/store_api.md`` for the method table; the zero-copy
    host path (``host_slab``, ``acquire_read``, ``reserve_write``...) is in
    :mod:`kvstore.store_shm`, ``pin``, ``release`` and ``expire_leases`` in
    :mod:`kvstore.store_pins`, ``register_namespace`` in :mod:`kvstore.store_namespaces`,
    ``stats``, ``health`` and ``check_integrity`` in :mod:`kvstore.store_report`."""

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
        # per start tier: does a put write a tier that keeps checksums (itself or write-through)
        self._eager_sums: list[bool] = [
            self._tiers[p].needs_checksum or any(
                self._tcfg[low].write_through and self._tiers[low].needs_checksum
                for low in range(p + 1, len(self._tiers)))
            for p in range(len(self._tiers))
        ]
        self._lock = threading.RLock()
        self._index = BlockIndex()
        self._leases = LeaseTable()
        # shm writes in flight: key -> (owner, lease expiry, host-slab extents)
        self._reservations: dict[BlockKey, tuple[str, float, list[tuple[int, int]]]] = {}
        self._staged: dict[str, Staged] = {}
        self._placeholder_seq = 0
        self._staged_bytes = 0
        # host slots of deleted blocks a reader may still copy: (free after, placeholder key)
        self._retired: list[tuple[float, BlockKey]] = []
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
        start = self._tier_pos(tier) if tier is not None else 0
        # Checksums only where a tier written now keeps them (computed outside the lock); a
        # block that lands in memory gets its checksum when it first goes lower (_write).
        sums: list[int | None] = [checksum(b) for b in blocks] if self._eager_sums[start] \
            else [None] * len(blocks)
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

    def lookup(
        self, namespace: str, hashes: Sequence[bytes], *, nowait: bool = False
    ) -> LookupResult:
        """Longest prefix of ``hashes`` that is stored, and the top tier of each block in it.
        No side effects on recency, leases or stats. With ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` rather than wait for the lock or ask S3."""
        self.namespace(namespace)
        # The hot loop of routing decisions: one dict.get and one list index per block. Only
        # bytes are ever indexed, so a hit proves its hash valid; the tail after the first
        # miss is validated below.
        by_mask = self._top_name_by_mask
        tiers: list[str] = []
        append = tiers.append
        with self._hold(nowait):
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
            if check_hashes(hashes[n:]):
                return self.lookup(namespace, [bytes(h) for h in hashes], nowait=nowait)
            if self._shared:
                if nowait:
                    raise WouldBlock("the rest of the chain must be looked up in S3")
                if self._discover(self._keys(namespace, hashes[n:]), prefix=True):
                    return self.lookup(namespace, hashes)
        return LookupResult(n, tiers)

    def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """Remove blocks from every tier, pinned or not. Returns how many existed. The host
        slots of a pinned block stay allocated (unreadable) until its pins would have expired:
        a shared-memory reader handed their extents copies the bytes it asked for, never those
        of a block stored there after the delete."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        deleted = 0
        host = self._host_pos()
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                if entry is None or entry.pending:
                    continue
                if host is not None and entry.holds(host) and self._leases.is_pinned(key):
                    self._placeholder_seq += 1
                    placeholder = (RETIRED_NS, str(self._placeholder_seq).encode())
                    self._slab(host).retire(key, placeholder)
                    self._retired.append((self._leases.until(key), placeholder))
                    self._policies[host].on_remove(key)
                    entry.tiers &= ~(1 << host)
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
            for owner in list(self._staged):
                self._drop_staged(owner)
            self._free_retired(math.inf)
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
                    log.warning("skipping %s: layout id differs from its namespace", fmt_key(key))
                    continue
                entry = self._index.get(key)
                if entry is None:
                    entry = self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id)
                    usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                    usage.blocks += 1
                    usage.bytes += meta.size
                entry.tiers |= 1 << pos
                self._track(pos, key, meta.size)
