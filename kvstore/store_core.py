"""What every part of the store shares: the state :class:`kvstore.store.Store` sets up, and
the small helpers that keep the index, the policies and the counters in step.

The store is split by concern into mixins over this state: placement and eviction
(:mod:`kvstore.store_place`), reads (:mod:`kvstore.store_read`), the shared-memory path
(:mod:`kvstore.store_shm`, :mod:`kvstore.store_stage`), pins and leases
(:mod:`kvstore.store_pins`), namespaces (:mod:`kvstore.store_namespaces`) and reports
(:mod:`kvstore.store_report`). All their ``_`` methods expect the store lock to be held
unless they say otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import InvalidHashError, KVStoreError, WouldBlock
from kvstore.index import BlockIndex, Entry
from kvstore.leases import LeaseTable
from kvstore.namespace import Namespace, NamespaceRegistry
from kvstore.policy import Admission, Policy
from kvstore.stats import Counters, NamespaceUsage
from kvstore.tiers import Tier
from kvstore.types import BlockKey

MAX_HASH_BYTES = 64


class StoreCore:
    """State and bookkeeping shared by the store's mixins (set up by ``Store.__init__``)."""

    config: StoreConfig
    _tcfg: list[TierConfig]
    _tiers: list[Tier]
    _policies: list[Policy]
    _admissions: list[Admission]
    _names: list[str]
    _top_name_by_mask: list[str | None]
    _shared: list[Any]
    _eager_sums: list[bool]
    _lock: threading.RLock
    _index: BlockIndex
    _leases: LeaseTable
    _reservations: dict[BlockKey, tuple[str, float, list[tuple[int, int]]]]
    _placeholder_seq: int  # numbers placeholder keys (staged places, retired slots)
    _retired: list[tuple[float, BlockKey]]  # host slots of deleted blocks readers may hold
    _namespaces: NamespaceRegistry
    _tier_stats: list[Counters]
    _ns_stats: dict[str, Counters]
    _ns_usage: dict[str, NamespaceUsage]
    _totals: Counters
    _closed: bool
    _prefetcher: ThreadPoolExecutor

    def namespace(self, name: str) -> Namespace:
        """The registered namespace ``name``; raises ``UnknownNamespaceError``. Takes no lock
        (one dict read; registration is one dict write), so an event loop may call it."""
        return self._namespaces.get(name)

    @contextmanager
    def _hold(self, nowait: bool) -> Iterator[None]:
        """The store lock; with ``nowait``, :class:`WouldBlock` instead of waiting for it."""
        if not self._lock.acquire(blocking=not nowait):
            raise WouldBlock("the store is busy")
        try:
            yield
        finally:
            self._lock.release()

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


    # -- small helpers ------------------------------------------------------------------------
    def _keys(self, namespace: str, hashes: Sequence[bytes]) -> list[BlockKey]:
        check_hashes(hashes)
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


def check_hashes(hashes: Sequence[bytes]) -> bool:
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


def fmt_key(key: BlockKey) -> str:
    return f"{key[0]}/{key[1].hex()}"

