"""The store's counters as one typed document: what ``Store.stats()`` returns, what
``GET /v1/stats`` and the data plane's ``stats`` answer with (a tenant's view of it), what the
Prometheus exporter, the command line and both clients read.

Per tier, ``queries`` counts the gets that reached the tier (not served by a tier above),
``hits`` those it served; per namespace and in the totals a query is one requested block.
Fields that only the admin's view has (the tiers' own ``backend`` counters, the totals'
``charged_bytes`` and pins) are None elsewhere and left out of the JSON (:meth:`StoreStats.doc`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

Count = Annotated[int, Field(ge=0)]  # a count or a size: never negative (every document)


class Counts(BaseModel):
    """Counters of the whole store, one tier or one namespace."""

    queries: Count = 0
    hits: Count = 0
    misses: Count = 0
    hit_rate: float = Field(default=0.0, ge=0, le=1)
    blocks: Count = 0
    bytes: Count = Field(
        default=0, description="in a tier: bytes charged against its capacity (whole slots in "
        "the host and device tiers; logical_bytes beside it); in the totals and a namespace: "
        "logical bytes, each block once however many tiers hold a copy (the admin's totals add "
        "charged_bytes, the sum of the tiers' bytes)")
    capacity_bytes: Count = 0
    evictions: Count = Field(default=0, description="blocks that left for room")
    promotions: Count = Field(default=0, description="blocks copied up (into it, for a tier)")
    demotions: Count = Field(default=0, description="blocks moved down (out of it, for a tier)")
    corrupt_dropped: Count = Field(default=0, description="blocks whose checksum failed; never "
                                   "returned")
    prefetched: Count = Field(default=0, description="blocks onboarded to the top tier by prefetch")
    dropped: Count = Field(default=0, description="blocks that left the store for good")
    stored: Count = Field(default=0, description="new blocks that puts stored")
    bytes_in: Count = Field(default=0, description="payload bytes of the stored blocks")
    bytes_out: Count = Field(default=0, description="payload bytes of the hits served (in a tier: "
                             "the hits it served)")


class TierStats(Counts):
    """One tier's row: its counters, what it holds and its policy."""

    logical_bytes: Count = Field(default=0, description="payload bytes of the blocks it holds")
    occupancy: float = Field(default=0.0, ge=0, description="bytes / capacity_bytes")
    policy: str | None = Field(default=None, description="the tier's eviction policy")
    corrupt_by_cause: dict[str, Count] = Field(
        default_factory=dict, description="corrupt_dropped by cause: a failed checksum in a "
        "store read (read), before a reply is sent from the slab (send), in a client's copy "
        "(client), in a demotion or spill (demote); or found by the disk tier: on a damaged "
        "page of its file (disk_page), a value whose header is not valid (disk_header), "
        "unwritable for a damaged neighbour page (disk_write)")
    backend: dict[str, Any] | None = Field(
        default=None, description="the tier's own counters (S3: uploads pending, errors, "
                                  "drops)")


class TotalStats(Counts):
    """The whole store's row (a tenant's: the sum of its namespaces' rows)."""

    charged_bytes: Count | None = Field(default=None, description="the sum of the tiers' bytes")
    pinned: Count | None = Field(default=None, description="blocks pinned by leases")
    pinned_bytes: Count | None = Field(default=None, description="bytes of the pinned blocks")


class StoreStats(BaseModel):
    """Totals, per tier (by tier name) and per namespace (by the name its reader calls it)."""

    totals: TotalStats
    tiers: dict[str, TierStats] = Field(default_factory=dict)
    namespaces: dict[str, Counts] = Field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The JSON document (what ``/v1/stats`` answers): fields a view does not have are
        left out rather than null."""
        return self.model_dump(mode="json", exclude_none=True)
