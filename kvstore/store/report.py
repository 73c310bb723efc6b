"""The store's reports on itself: counters, health, where the blocks of a chain are (and the
ghosts of those that left) and a full consistency check. Reads the parts' records; changes
nothing but what the tiers changed on their own (taken into the books first). Every method but
:meth:`Report.health` expects the store lock to be held.

The invariants :meth:`Report.check_integrity` checks: a key is in tier ``t``'s policy exactly
when its index entry has bit ``t`` set; every tier's ``used_bytes() <= capacity_bytes``;
usage and logical bytes match the index; every reserved host place has a holder that frees
it. The store also keeps two it cannot check after the fact: pinned blocks and blocks being
read are never evicted, and a block is returned only if its bytes match the checksum recorded
when it was acknowledged.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import KVStoreError
from kvstore.protocol.health import StoreHealth, TierHealth
from kvstore.protocol.stats import Counts, StoreStats, TierStats, TotalStats
from kvstore.store.books import Books
from kvstore.store.host_path import HostPath
from kvstore.store.index import fmt_key
from kvstore.store.stack import TierStack
from kvstore.types import BlockKey, Ghost, Trace

TRACE_CHUNK = 4096  # blocks traced per hold of the store lock, so that puts and gets go on
Where = tuple[list[list[str]], list[Ghost | None]]  # a traced chunk: tiers and ghosts per block


class IntegrityError(KVStoreError, AssertionError):
    """The index, the tiers and the policies disagree, or a capacity is exceeded."""


class Report:
    """``stats``, ``health``, ``trace`` and ``check_integrity`` over the store's parts."""

    def __init__(self, stack: TierStack, books: Books, host_path: HostPath) -> None:
        self._stack, self._host_path, self._drift = stack, host_path, books.drift
        self._ledger, self._tally, self._leases = books.ledger, books.tally, books.leases
        self._ghosts = books.ghosts

    def stats(self) -> StoreStats:
        """The counters and sizes, after what the tiers changed on their own."""
        self._drift.take_all()  # what S3 adopted or lost on its own, counted first
        self._drift.sweep()  # what a lookup or a delete found counts from now, not later
        tiers = {}
        for pos, tier in enumerate(self._stack.tiers):
            # bytes: what the tier charges against its capacity (whole slots in slab
            # tiers); logical_bytes: the payload bytes of the blocks it holds
            tiers[self._stack.names[pos]] = TierStats(
                **self._tally.tiers[pos].as_dict(),
                blocks=self._ledger.resident(pos),
                bytes=tier.used_bytes(),
                logical_bytes=self._ledger.resident_bytes(pos),
                capacity_bytes=tier.capacity_bytes,
                occupancy=tier.used_bytes() / tier.capacity_bytes,
                policy=self._stack.configs[pos].policy,
                corrupt_by_cause={cause: n for (p, cause), n in
                                  self._tally.corrupt_causes.items() if p == pos},
                backend=tier.stats(),  # S3: pending uploads, drops, errors
            )
        capacity = sum(t.capacity_bytes for t in self._stack.tiers)
        namespaces = {}
        usages = self._ledger.usages()
        for name in sorted(set(self._tally.namespaces) | set(usages)):
            usage = self._ledger.usage(name)
            # namespaces share the tiers: each may grow to the whole capacity
            namespaces[name] = Counts(**self._tally.ns(name).as_dict(), blocks=usage.blocks,
                                      bytes=usage.bytes, capacity_bytes=capacity)
        # bytes: logical, each block once however many tiers hold a copy (as in the
        # namespace rows); charged_bytes: the sum of the tiers' bytes
        totals = TotalStats(
            **self._tally.totals.as_dict(),
            blocks=sum(u.blocks for u in usages.values()),
            bytes=sum(u.bytes for u in usages.values()),
            charged_bytes=sum(t.used_bytes() for t in self._stack.tiers),
            capacity_bytes=capacity,
            pinned=len(self._leases),
            pinned_bytes=self._leases.total_bytes(),
        )
        return StoreStats(totals=totals, tiers=tiers, namespaces=namespaces)

    def where(self, keys: Sequence[BlockKey]) -> Where:
        """Every tier holding each block (top first), and the ghost of each block the store
        does not hold (None if it has none)."""
        names = self._stack.names
        tiers: list[list[str]] = []
        ghosts: list[Ghost | None] = []
        for key in keys:
            entry = self._ledger.visible(key)
            tiers.append([] if entry is None else [names[p] for p in entry.positions()])
            ghosts.append(self._ghosts.get(key) if entry is None else None)
        return tiers, ghosts

    def trace(self, chunks: list[Where]) -> Trace:
        """A chain's :meth:`where`, read a chunk at a time (each chunk is as of one moment,
        the whole may straddle a few), with the ghost record's size."""
        tiers = [t for chunk, _ in chunks for t in chunk]
        ghosts = [g for _, chunk in chunks for g in chunk]
        return Trace(tiers, ghosts, len(self._ghosts), self._ghosts.capacity)

    def health(self, closed: bool) -> StoreHealth:
        tiers: dict[str, TierHealth] = {}
        ok = not closed
        for tier in self._stack.tiers:
            try:
                health = TierHealth.model_validate({"ok": False, **tier.health()})
            except Exception as exc:  # a health probe must never take the server down
                health = TierHealth.model_validate(
                    {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            tiers[tier.name] = health
            # the shared S3 tier degrades the store but does not stop it from serving
            if not health.ok and tier.name != "s3":
                ok = False
        return StoreHealth(ok=ok, tiers=tiers)

    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` if the index, tiers and policies disagree."""
        self._drift.take_all()
        for pos, tier in enumerate(self._stack.tiers):
            name = self._stack.names[pos]
            if tier.used_bytes() > tier.capacity_bytes:
                raise IntegrityError(
                    f"{name}: {tier.used_bytes()} bytes used > capacity {tier.capacity_bytes}"
                )
            resident = [k for k, e in self._ledger.items() if e.holds(pos)]
            logical = sum(e.size for _, e in self._ledger.items() if e.holds(pos))
            if logical != self._ledger.resident_bytes(pos):
                raise IntegrityError(f"{name}: blocks of {logical} bytes, ledger counts "
                                     f"{self._ledger.resident_bytes(pos)}")
            policy = self._ledger.policies[pos]
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
        for key, entry in self._ledger.items():
            if entry.pending:
                if not self._host_path.reserved(key):
                    raise IntegrityError(f"{fmt_key(key)} pending without a reservation")
                continue
            if not entry.tiers:
                raise IntegrityError(f"{fmt_key(key)} indexed in no tier")
            if entry.checksum is None and any(
                    self._stack.tiers[p].needs_checksum for p in entry.positions()):
                raise IntegrityError(f"{fmt_key(key)} on a checksummed tier without checksum")
            counted = usage.setdefault(key[0], [0, 0])
            counted[0] += 1
            counted[1] += entry.size
        for name, have in self._ledger.usages().items():
            want = usage.get(name, [0, 0])
            if [have.blocks, have.bytes] != want:
                raise IntegrityError(
                    f"namespace {name}: counted {have.blocks} blocks/{have.bytes} bytes, "
                    f"index has {want[0]}/{want[1]}"
                )
        for tier in self._stack.tiers:
            try:
                tier.check_integrity()  # slab tiers: slot ownership
            except RuntimeError as exc:
                raise IntegrityError(f"{tier.name}: {exc}") from exc
        if self._stack.host is not None:  # every reserved slot has a holder that frees it
            held, known = self._stack.slab().reserved_keys(), self._host_path.places()
            if held != known:
                raise IntegrityError(
                    f"host slab: {len(held - known)} reserved places nothing will free, "
                    f"{len(known - held)} places held for writers are not reserved")
        for key in self._leases.pinned_keys():
            if key not in self._ledger:
                raise IntegrityError(f"{fmt_key(key)} pinned but not indexed")
        if len(self._ghosts) > self._ghosts.capacity:
            raise IntegrityError(f"ghost record holds {len(self._ghosts)} departures, over "
                                 f"its capacity {self._ghosts.capacity}")
