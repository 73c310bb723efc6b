"""A histogram of reuse distances in bytes, on a log scale over the capacities a curve is asked
about: how much of a stream's weight would hit in an LRU cache of any capacity in that range.

Bins are ``1 / bins_per_octave`` of an octave wide (1.5% with the default 48). Each keeps two
weights (the accesses its reuses stand for, and the ``heavy`` weight the tracker's regression
estimate uses) and the smallest and largest distance it saw, so a capacity inside a bin takes the
share of the bin between those two by linear interpolation, and a histogram of equal distances
(one namespace of equal-sized blocks read in a fixed cycle) is exact: a capacity at or above
them takes the whole bin. Distances below the range count as hits at every capacity asked
about, distances above as misses. Memory: four 8-byte numbers per bin, allocated at once
(``bins_per_octave * log2(hi / lo)`` bins).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

_INF = float("inf")


class DistanceHistogram:
    """Weights of reuse distances in ``[lo, hi]`` bytes. Not thread-safe."""

    __slots__ = ("_dmax", "_dmin", "_heavy", "_scale", "_weight", "hi", "lo", "over",
                 "under", "under_heavy")

    def __init__(self, lo: float, hi: float, bins_per_octave: int) -> None:
        if not 0 < lo < hi:
            raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")
        self.lo, self.hi = float(lo), float(hi)
        self._scale = bins_per_octave / math.log(2)  # bin = floor(ln(d / lo) * scale)
        bins = math.ceil(math.log2(hi / lo) * bins_per_octave) + 1
        self._weight = array("d", bytes(8 * bins))
        self._heavy = array("d", bytes(8 * bins))
        self._dmin = array("d", [_INF]) * bins
        self._dmax = array("d", bytes(8 * bins))
        self.under = self.under_heavy = 0.0  # weights of distances below lo
        self.over = 0.0  # weight of distances above hi

    def add(self, distance: float, weight: float, heavy: float = 0.0) -> None:
        """Record a reuse at ``distance`` bytes with ``weight`` (accesses it stands for) and
        ``heavy`` weight."""
        if distance <= self.lo:
            self.under += weight
            self.under_heavy += heavy
            return
        if distance > self.hi:
            self.over += weight
            return
        i = int(math.log(distance / self.lo) * self._scale)
        self._weight[i] += weight
        self._heavy[i] += heavy
        if distance < self._dmin[i]:
            self._dmin[i] = distance
        if distance > self._dmax[i]:
            self._dmax[i] = distance

    def hits(self, capacities: Sequence[float]) -> tuple[list[float], list[float]]:
        """For each capacity (bytes), the weight and the heavy weight of the reuses at a
        distance of at most it."""
        weight = np.frombuffer(self._weight, dtype=np.float64)
        heavy = np.frombuffer(self._heavy, dtype=np.float64)
        dmin = np.frombuffer(self._dmin, dtype=np.float64)
        dmax = np.frombuffer(self._dmax, dtype=np.float64)
        caps = np.asarray(capacities, dtype=np.float64)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(caps >= dmax, 1.0,
                             np.where(caps < dmin, 0.0, (caps - dmin) / (dmax - dmin)))
        share = np.nan_to_num(share, nan=0.0)
        light = (share * weight).sum(axis=1) + self.under
        dense = (share * heavy).sum(axis=1) + self.under_heavy
        return [float(x) for x in light], [float(x) for x in dense]

    def total(self) -> float:
        """Weight of every reuse recorded, in range or not."""
        return float(np.frombuffer(self._weight, dtype=np.float64).sum()) + self.under + \
            self.over

    def nbytes(self) -> int:
        return 32 * len(self._weight)
