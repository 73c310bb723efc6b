"""What a what-if tracker samples, which capacities it evaluates, and its defaults (one table,
units in the comments)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

Adjust = Literal["regression", "shards", "none"]

DEFAULT_SAMPLE_RATE = 0.01  # fraction of block hashes tracked (SHARDS' R)
DEFAULT_MAX_KEYS = 1 << 17  # tracked keys at most; past it the rate is lowered (fixed-size)
DEFAULT_POINTS = 17  # capacities a curve is evaluated at: 0.25x to 4x in quarter octaves
DEFAULT_LOW = 0.25  # smallest capacity, times the current one
DEFAULT_HIGH = 4.0  # largest capacity, times the current one
DEFAULT_BINS_PER_OCTAVE = 48  # resolution of the reuse-distance histogram (1.5% wide bins)
HIST_MARGIN = 4.0  # the histogram resolves distances from low / 4 to high * 4 times current


@dataclass(frozen=True, slots=True)
class WhatIfConfig:
    """One tier's tracker.

    ``sample_rate``: the fraction of block hashes sampled at start (SHARDS' fixed rate).
    ``max_keys``: the most keys tracked at once (None: no bound, fixed-rate SHARDS); when a new
    key would pass it, the rate is lowered so that the keys with the largest hash values leave
    (fixed-size SHARDS), which bounds memory whatever the number of distinct blocks.
    ``policies``: policies (names in :data:`kvstore.policy.POLICIES`) simulated as miniature
    caches, one per capacity point; the LRU curve comes from reuse distances whatever this
    holds. ``adjust``: how the sample's excess or shortfall of requests against the count the
    tracker saw is counted (:mod:`kvstore.whatif.estimate`): ``regression`` (the default) at
    the hit rate of the most requested sampled blocks, ``shards`` as hits (SHARDS_adj),
    ``none`` not at all (the sample's own hit rate). ``uniform_hashes``: block hashes
    are uniform already (SHA-256 or xxhash outputs, as every chained block hash is), so the
    sampling test is one comparison of the hash with a threshold; False hashes each block
    hash first (blake2b), for keys that are not hash outputs. ``fill``: the fraction of a
    capacity the tier holds when full (the store evicts past its high watermark down to its
    low one: their mean is a fair value); curves are labelled with the capacity itself.
    """

    sample_rate: float = DEFAULT_SAMPLE_RATE
    max_keys: int | None = DEFAULT_MAX_KEYS
    points: int = DEFAULT_POINTS
    low: float = DEFAULT_LOW
    high: float = DEFAULT_HIGH
    policies: tuple[str, ...] = ()
    adjust: Adjust = "regression"
    uniform_hashes: bool = True
    fill: float = 1.0
    bins_per_octave: int = DEFAULT_BINS_PER_OCTAVE

    def __post_init__(self) -> None:
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if self.max_keys is not None and self.max_keys < 16:
            raise ValueError(f"max_keys must be at least 16 (or None), got {self.max_keys}")
        if self.points < 2:
            raise ValueError(f"points must be at least 2, got {self.points}")
        if not 0.0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high, got low={self.low} high={self.high}")
        if not 0.0 < self.fill <= 1.0:
            raise ValueError(f"fill must be in (0, 1], got {self.fill}")
        if self.adjust not in get_args(Adjust):
            raise ValueError(f"adjust must be one of {', '.join(get_args(Adjust))}, "
                             f"got {self.adjust!r}")
        if not 4 <= self.bins_per_octave <= 1024:
            raise ValueError(f"bins_per_octave must be in 4..1024, got {self.bins_per_octave}")
        from kvstore.policy import POLICIES

        unknown = [name for name in self.policies if name not in POLICIES.names()]
        if unknown:
            raise ValueError(f"unknown eviction policy {unknown[0]!r}; known: "
                             f"{', '.join(POLICIES.names())}")

    def capacities(self, current: int) -> list[int]:
        """``points`` capacities in bytes, geometrically spaced from ``low`` to ``high`` times
        ``current`` (with the defaults: quarter octaves, so 0.5x, 1x, 2x and 4x are points)."""
        if current <= 0:
            raise ValueError(f"current capacity must be positive, got {current}")
        step = math.log(self.high / self.low) / (self.points - 1)
        return [max(1, round(current * self.low * math.exp(i * step)))
                for i in range(self.points)]
