"""Frozen configuration objects for the store and its tiers.

Defaults live here, once, with units in comments. The server builds these from YAML,
``KVSTORE_*`` variables and flags (see ``server/settings.py``); library users build them
directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstore.whatif.config import WhatIfConfig

TIER_ORDER = ("device", "host", "disk", "s3")  # top to bottom

DEFAULT_HOST_CAPACITY = 1 << 30  # bytes: 1 GiB of host RAM
DEFAULT_DISK_CAPACITY = 16 << 30  # bytes: 16 GiB of LMDB
DEFAULT_SLOT_BYTES = 64 << 10  # bytes: slot size of memory slab tiers
DEFAULT_LEASE_S = 30.0  # seconds a pin lives unless renewed
DEFAULT_MAX_LEASE_S = 300.0  # seconds: every lease asked for longer is cut to this
DEFAULT_MAX_PREFETCH_BLOCKS = 1 << 18  # blocks queued for prefetch: ~40 MiB of keys at most
DEFAULT_HIGH_WATERMARK = 0.95  # fraction of capacity that triggers eviction
DEFAULT_LOW_WATERMARK = 0.85  # fraction of capacity eviction brings usage down to
DEFAULT_MAX_NAMESPACES = 1024  # namespaces a store holds at most, all tenants together
DEFAULT_MAX_NAMESPACES_PER_TENANT = 64  # namespaces bound to any one tenant at most
DEFAULT_GHOST_ENTRIES = 65536  # blocks: recent departures remembered (about 200 bytes each)


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One tier. ``kind`` is one of :data:`TIER_ORDER`; ``options`` go to the tier class
    (``path`` for disk, ``device`` for device, ``bucket``/``endpoint``... for s3,
    ``slot_bytes`` for memory tiers)."""

    kind: str
    capacity_bytes: int
    policy: str = "lru"  # name in kvstore.policy registry
    admission: str = "always"  # name in kvstore.policy registry of admission rules
    high_watermark: float = DEFAULT_HIGH_WATERMARK
    low_watermark: float = DEFAULT_LOW_WATERMARK
    write_through: bool = False  # also write each put into this tier synchronously
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in TIER_ORDER:
            raise ValueError(f"unknown tier kind {self.kind!r}; known: {', '.join(TIER_ORDER)}")
        if not isinstance(self.capacity_bytes, int) or self.capacity_bytes <= 0:
            raise ValueError(f"{self.kind} tier capacity must be a positive number of bytes")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ValueError(
                f"{self.kind} tier watermarks must satisfy 0 < low <= high <= 1, got "
                f"low={self.low_watermark} high={self.high_watermark}"
            )


def _default_whatif() -> WhatIfConfig:
    """The trackers' defaults (imported late: :mod:`kvstore.whatif` imports the policies,
    which import this module)."""
    from kvstore.whatif.config import WhatIfConfig

    return WhatIfConfig()


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The whole store: tiers top to bottom (a subset of :data:`TIER_ORDER`, in that order)."""

    tiers: tuple[TierConfig, ...]
    promote_on_hit: bool = True  # a get from a lower tier copies the block to the top tier
    default_lease_s: float = DEFAULT_LEASE_S
    max_lease_s: float = DEFAULT_MAX_LEASE_S  # longer leases are cut to this many seconds
    # bytes of blocks one tenant may hold pinned at once (pins taken for a tenant); None: no cap
    max_pinned_bytes_per_tenant: int | None = None
    prefetch_workers: int = 2  # threads that onboard prefetched blocks
    # blocks queued for those threads, all callers together (past it prefetch: BusyError)
    max_prefetch_blocks: int = DEFAULT_MAX_PREFETCH_BLOCKS
    namespaces_path: str | None = None  # JSON file that persists registered namespaces
    spill_on_close: bool = True  # close() copies memory-only blocks to the disk tier
    # settle the host tier into the persistent tier below it from a thread, off the store
    # lock while the batch is written (kvstore/store/demoter.py); False: in the writing call
    background_demotion: bool = False
    max_namespaces: int = DEFAULT_MAX_NAMESPACES  # registered namespaces, in total
    max_namespaces_per_tenant: int = DEFAULT_MAX_NAMESPACES_PER_TENANT  # bound to one tenant
    ghost_entries: int = DEFAULT_GHOST_ENTRIES  # departed blocks remembered for explain; 0: none
    # what-if curves of every tier (kvstore.store.sizing); None: off
    whatif: WhatIfConfig | None = field(default_factory=_default_whatif)

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("a store needs at least one tier")
        kinds = [t.kind for t in self.tiers]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each tier kind may appear once, got {kinds}")
        if kinds != sorted(kinds, key=TIER_ORDER.index):
            raise ValueError(f"tiers must be ordered {' > '.join(TIER_ORDER)}, got {kinds}")
        if not (math.isfinite(self.max_lease_s) and 0 < self.default_lease_s <= self.max_lease_s):
            raise ValueError(f"leases must satisfy 0 < default_lease_s <= max_lease_s < inf, got "
                             f"default_lease_s={self.default_lease_s} "
                             f"max_lease_s={self.max_lease_s}")
        quota = self.max_pinned_bytes_per_tenant
        if quota is not None and quota < 1:
            raise ValueError(f"max_pinned_bytes_per_tenant must be positive (or None), "
                             f"got {quota}")
        if self.prefetch_workers < 1:
            raise ValueError("prefetch_workers must be at least 1")
        if self.max_prefetch_blocks < 1:
            raise ValueError(f"max_prefetch_blocks must be at least 1, got "
                             f"{self.max_prefetch_blocks}")
        if self.max_namespaces < 1 or self.max_namespaces_per_tenant < 1:
            raise ValueError("max_namespaces and max_namespaces_per_tenant must be at least 1")
        if self.ghost_entries < 0:
            raise ValueError(f"ghost_entries must be >= 0, got {self.ghost_entries}")
