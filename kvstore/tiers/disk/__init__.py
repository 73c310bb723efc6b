"""The disk tier as a package: the tier over one LMDB file, its records (keys, headers), its
count records, the file as an index, its writes, the environment it opens and grows, and what
a damaged page costs."""

from __future__ import annotations

from kvstore.tiers.disk.tier import DiskTier

__all__ = ["DiskTier"]
