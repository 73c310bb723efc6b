"""Counters the store keeps per tier and per namespace, and the dict shape ``stats()`` returns.

Per tier, ``queries`` counts the gets that reached the tier (not served by a tier above),
``hits`` those it served, so each tier's hit rate reads as "of what got this far, how much
was here". Per namespace and in the totals, a query is one requested block.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hit_rate"] = self.hits / self.queries if self.queries else 0.0
        return out


@dataclass(slots=True)
class NamespaceUsage:
    blocks: int = 0
    bytes: int = 0
