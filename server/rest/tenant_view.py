"""What a tenant sees of the store's stats: its own namespaces, and totals computed over them
only. The admin (and every caller when auth is off) sees the whole document.

Tiers are shared by every tenant, so their counters and occupancy tell one tenant about the
others' traffic: a tenant's view has no tiers, and its totals count only its own blocks and
requests (``capacity_bytes`` stays the store's, which is configuration, not activity).
"""

from __future__ import annotations

from typing import Any

from kvstore.store import StoreAPI
from server.auth import Principal

SUMMED = ("queries", "hits", "misses", "evictions", "promotions", "demotions",
          "corrupt_dropped", "prefetched", "dropped", "stored", "bytes_in", "bytes_out",
          "blocks", "bytes")


def visible_stats(store: StoreAPI, principal: Principal) -> dict[str, Any]:
    """``store.stats()`` as ``principal`` may see it."""
    doc = store.stats()
    if principal.admin:
        return doc
    mine = {ns.name for ns in store.namespaces() if principal.can_access(ns)}
    namespaces = {k: v for k, v in doc.get("namespaces", {}).items() if k in mine}
    totals: dict[str, Any] = {key: sum(int(v.get(key, 0)) for v in namespaces.values())
                              for key in SUMMED}
    totals["capacity_bytes"] = doc.get("totals", {}).get("capacity_bytes", 0)
    totals["hit_rate"] = totals["hits"] / totals["queries"] if totals["queries"] else 0.0
    return {"totals": totals, "tiers": {}, "namespaces": namespaces}
