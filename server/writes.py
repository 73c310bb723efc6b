"""The one place that decides what "acknowledged" means for a put, shared by both planes.

A plain put is acknowledged once the block is in the store (RAM; demoted to disk later,
write-back). A *durable* put goes straight to the first persistent tier (LMDB, committed with
sync) and the persistent tiers are flushed before the acknowledgement: after ``kill -9`` and
a restart on the same folder, every durably acknowledged block is readable byte-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstore.errors import DiskFullError, TierUnavailableError
from kvstore.store import StoreAPI
from kvstore.types import BlockHash, PutResult


def durable_put(
    store: StoreAPI, namespace: str, hashes: Sequence[BlockHash], blocks: Sequence[Any],
    durable: bool, tier: str | None, sums: Sequence[int | None] | None = None,
) -> PutResult:
    """``store.put`` with the durability rule above. Raises TierUnavailableError for a durable
    put when no persistent tier is configured, and :class:`DiskFullError` naming the full disk
    when the persistent tier refused blocks because its file system is full."""
    if not durable:
        result: PutResult = store.put(namespace, hashes, blocks, sums=sums)
        return result
    if tier is None:
        raise TierUnavailableError("durable put asked for, but no persistent tier is configured")
    result = store.put(namespace, hashes, blocks, tier=tier, sums=sums)
    if result.refused:
        health = store.tier(tier).health()
        if health.get("disk_full"):
            raise DiskFullError(f"{result.refused} of {len(hashes)} blocks not stored durably: "
                                f"{health.get('error', 'disk full')}")
    store.flush()
    return result
