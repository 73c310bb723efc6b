"""Miniature simulations (Waldspurger et al., "Cache modeling and optimization using miniature
simulations", USENIX ATC'17): a policy that reuse distances cannot describe (LFU, S3-FIFO, the
sampled policies) is run on the spatially sampled stream in a cache scaled down by the same
rate, one cache per capacity point; the hit rate of the scaled cache on the sample estimates
the hit rate of the full cache on the whole stream.

The caches are :class:`~kvstore.whatif.simcache.SimCache` objects over the very policy classes
the tiers use, so a simulated policy cannot drift from the real one. Keys are the tracker's
64-bit integers. Memory: each cache holds at most ``capacity * rate`` bytes of sampled blocks,
so the caches of a 17-point grid from 0.25x to 4x hold about 22.5 times the current capacity
times the rate, and never more keys each than the tracker tracks; a resident key costs what
the policy keeps for it (about 100 bytes for LRU, 250 for LFU and S3-FIFO) plus 100 bytes
for its size.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from kvstore.whatif.simcache import SimCache


class MiniSims:
    """``policy`` at each of ``capacities`` (bytes, full scale), scaled by ``rate``."""

    __slots__ = ("_caches", "capacities", "policy", "rate")

    def __init__(self, policy: str, capacities: Sequence[int], rate: float) -> None:
        self.policy = policy
        self.capacities = list(capacities)
        self.rate = rate
        self._caches = [SimCache(policy, round(c * rate)) for c in self.capacities]

    def read(self, key: Hashable, size: int, weight: float, heavy: float, hits: list[float],
             heavy_hits: list[float]) -> None:
        """A sampled request: ``hits[i] += weight`` and ``heavy_hits[i] += heavy`` for each
        point whose cache holds ``key``."""
        for i, cache in enumerate(self._caches):
            if cache.read(key, size):
                hits[i] += weight
                heavy_hits[i] += heavy

    def insert(self, key: Hashable, size: int) -> None:
        """A sampled block entering the tier without a request (a demotion)."""
        for cache in self._caches:
            cache.insert(key, size)

    def remove(self, keys: Iterable[Hashable]) -> None:
        """Keys that left the sample (a lowered rate, a deleted namespace)."""
        keys = list(keys)
        for cache in self._caches:
            for key in keys:
                cache.remove(key)

    def rescale(self, rate: float) -> None:
        """The sample rate is now ``rate``: each cache shrinks (or grows) to match."""
        self.rate = rate
        for cache, capacity in zip(self._caches, self.capacities, strict=True):
            cache.resize(round(capacity * rate))

    def resident(self) -> int:
        """Keys held by all the caches together."""
        return sum(len(c) for c in self._caches)
