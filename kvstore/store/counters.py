"""The store's counters, per tier, per namespace and in total, and the events that move them.

Per tier, ``queries`` counts the gets that reached the tier (not served by a tier above),
``hits`` those it served, so each tier's hit rate reads as "of what got this far, how much
was here". Per namespace and in the totals, a query is one requested block.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from kvstore.types import CorruptCause

COUNTERS = (
    "queries",
    "hits",
    "misses",
    "evictions",
    "promotions",
    "demotions",
    "corrupt_dropped",
    "prefetched",
    "dropped",
    "stored",
    "bytes_in",
    "bytes_out",
)


@dataclass(slots=True)
class Counters:
    queries: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0  # blocks that left a tier (or the store) to make room
    promotions: int = 0  # blocks copied up (into this tier, for a tier)
    demotions: int = 0  # blocks moved down (out of this tier, for a tier)
    corrupt_dropped: int = 0  # blocks whose checksum failed; never returned
    prefetched: int = 0  # blocks onboarded to the top tier by prefetch
    dropped: int = 0  # blocks that left the store for good (last tier full, refused)
    stored: int = 0  # new blocks that clients' puts stored (not those already there)
    bytes_in: int = 0  # payload bytes of the ``stored`` blocks
    bytes_out: int = 0  # payload bytes of the hits served (for a tier: those it served)

    def as_dict(self) -> dict[str, Any]:
        """The counters and the hit rate, as the fields of a
        :class:`~kvstore.protocol.stats.Counts` row."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hit_rate"] = self.hits / self.queries if self.queries else 0.0
        return out


@dataclass(slots=True)
class NamespaceUsage:
    blocks: int = 0
    bytes: int = 0


class Tally:
    """Every counter of the store. Each event is one method, so that a counter moves the same
    way wherever its event happens. Not thread-safe: called under the store lock."""

    def __init__(self, tiers: int) -> None:
        self.tiers = [Counters() for _ in range(tiers)]
        self.namespaces: dict[str, Counters] = {}
        self.totals = Counters()
        # every block of a namespace has its size: bytes are counted from these
        self.block_bytes: dict[str, int] = {}
        # (tier, cause) -> blocks dropped there: a failed checksum (kvstore.store.verify), or
        # what the tier found itself (a damaged disk page or header: kvstore.store.drift)
        self.corrupt_causes: Counter[tuple[int, str]] = Counter()

    def ns(self, name: str) -> Counters:
        return self.namespaces.setdefault(name, Counters())

    def registered(self, name: str, block_bytes: int) -> None:
        """Namespace ``name`` exists (its rows show, zero, in the stats)."""
        self.ns(name)
        self.block_bytes[name] = block_bytes

    def forgotten(self, name: str) -> None:
        """Namespace ``name`` was deleted: its rows go."""
        self.namespaces.pop(name, None)
        self.block_bytes.pop(name, None)

    def stored(self, name: str, count: int) -> None:
        """A put stored ``count`` new blocks of namespace ``name``."""
        size = count * self.block_bytes.get(name, 0)
        for c in (self.ns(name), self.totals):
            c.stored += count
            c.bytes_in += size

    def evicted(self, pos: int, count: int) -> None:
        """``count`` blocks left tier ``pos`` to make room (demoted or dropped)."""
        self.tiers[pos].evictions += count

    def demoted(self, pos: int, namespace: str) -> None:
        """A block of ``namespace`` got a copy in a lower tier on leaving tier ``pos``."""
        self.tiers[pos].demotions += 1
        self.ns(namespace).demotions += 1
        self.totals.demotions += 1

    def demoted_many(self, pos: int, namespaces: list[str]) -> None:
        """:meth:`demoted` of a block of each of ``namespaces``."""
        self.tiers[pos].demotions += len(namespaces)
        self.totals.demotions += len(namespaces)
        for name, n in Counter(namespaces).items():
            self.ns(name).demotions += n

    def evicted_from_store(self, namespace: str) -> None:
        """An evicted block had no other copy: it left the store."""
        ns = self.ns(namespace)
        ns.evictions += 1
        ns.dropped += 1
        self.totals.evictions += 1
        self.totals.dropped += 1

    def lost(self, namespace: str) -> None:
        """A block left the store because its tier lost it behind the store's back."""
        self.ns(namespace).dropped += 1
        self.totals.dropped += 1

    def promoted(self, pos: int, namespace: str) -> None:
        self.tiers[pos].promotions += 1
        self.ns(namespace).promotions += 1
        self.totals.promotions += 1

    def promoted_many(self, pos: int, namespaces: list[str]) -> None:
        """:meth:`promoted` of a block of each of ``namespaces``."""
        self.tiers[pos].promotions += len(namespaces)
        self.totals.promotions += len(namespaces)
        for name, n in Counter(namespaces).items():
            self.ns(name).promotions += n

    def corrupt(self, pos: int, namespace: str, cause: CorruptCause = "read") -> None:
        """A block of ``namespace`` failed its checksum in tier ``pos``, or was found corrupt
        by the tier itself (``cause``: a :data:`~kvstore.types.CorruptCause`) and was dropped."""
        self.corrupt_causes[(pos, cause)] += 1
        self.tiers[pos].corrupt_dropped += 1
        self.ns(namespace).corrupt_dropped += 1
        self.totals.corrupt_dropped += 1

    def prefetched(self, namespaces: list[str]) -> None:
        """Prefetch onboarded one block of each of ``namespaces`` to the top tier."""
        self.tiers[0].prefetched += len(namespaces)
        self.totals.prefetched += len(namespaces)
        for name in namespaces:
            self.ns(name).prefetched += 1

    def reads(self, namespaces: list[str], served_by: list[int], hits: list[bool]) -> None:
        """One get per block: ``served_by[i]`` is the tier that served block ``i`` (-1: a
        miss). Each tier above the serving one was asked and missed."""
        bottom = len(self.tiers) - 1
        # one update per distinct (namespace, tier, hit): a batch is mostly one of them
        for (name, pos, hit), n in Counter(zip(namespaces, served_by, hits, strict=True)).items():
            ns = self.ns(name)
            out = self.block_bytes.get(name, 0) if hit else 0
            for c in (ns, self.totals):
                c.queries += n
                c.hits += n * hit
                c.misses += n * (not hit)
                c.bytes_out += n * out
            last = pos if hit else bottom
            for p in range(last + 1):
                t = self.tiers[p]
                t.queries += n
                served = hit and p == pos
                t.hits += n * served
                t.misses += n * (not served)
                t.bytes_out += n * out if served else 0
