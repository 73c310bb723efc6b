"""Storage tiers, top (fastest) to bottom. Imported lazily by kind."""

from __future__ import annotations

from kvstore.config import TierConfig
from kvstore.registry import Registry
from kvstore.tiers.base import BlockMeta, Tier

TIERS = Registry(
    "tier",
    {
        "device": "kvstore.tiers.device:DeviceTier",
        "host": "kvstore.tiers.host:HostTier",
        "disk": "kvstore.tiers.disk:DiskTier",
        "s3": "kvstore.tiers.s3:S3Tier",
    },
)


def make_tier(cfg: TierConfig) -> Tier:
    """Build the tier that ``cfg`` names: ``cls(cfg.capacity_bytes, **cfg.options)``."""
    tier: Tier = TIERS.create(cfg.kind, cfg.capacity_bytes, **cfg.options)
    return tier


__all__ = ["TIERS", "BlockMeta", "Tier", "make_tier"]
