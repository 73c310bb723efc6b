"""The S3 tier as a package: the tier, its read and write sides, its requests, object layout
(grouped blocks), write-back queue, holdings, discovery and health."""

from __future__ import annotations

from kvstore.tiers.s3.tier import S3Tier

__all__ = ["S3Tier"]
