"""The store's reports on itself: counters, health and a full consistency check.

A mixin of :class:`kvstore.store.Store` over the state of :class:`kvstore.store_core.StoreCore`.
"""

from __future__ import annotations

from typing import Any

from kvstore.errors import KVStoreError
from kvstore.stats import NamespaceUsage
from kvstore.store_core import StoreCore, fmt_key


class IntegrityError(KVStoreError, AssertionError):
    """The index, the tiers and the policies disagree, or a capacity is exceeded."""


class Reports(StoreCore):
    """``stats``, ``health`` and ``check_integrity``."""

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
                        raise IntegrityError(f"{name}: {fmt_key(key)} indexed, not in policy")
                    if tier.name != "s3" and not tier.contains(key):
                        raise IntegrityError(f"{name}: {fmt_key(key)} indexed, not in tier")
            usage: dict[str, list[int]] = {}
            for key, entry in self._index.items():
                if entry.pending:
                    if key not in self._reservations:
                        raise IntegrityError(f"{fmt_key(key)} pending without a reservation")
                    continue
                if not entry.tiers:
                    raise IntegrityError(f"{fmt_key(key)} indexed in no tier")
                if entry.checksum is None and any(
                        self._tiers[p].needs_checksum for p in entry.positions()):
                    raise IntegrityError(f"{fmt_key(key)} on a checksummed tier without checksum")
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
                    raise IntegrityError(f"{fmt_key(key)} pinned but not indexed")
