"""What a tracker answers: a miss-ratio curve as hit rates at capacities, for one tier and one
scope of its traffic (the whole tier, a namespace, a tenant's namespaces). The wire form is
:class:`kvstore.protocol.whatif.WhatIfOut`."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

Method = Literal["shards", "mini"]


class Point(NamedTuple):
    capacity_bytes: int
    hit_rate: float


@dataclass(frozen=True, slots=True)
class Curve:
    """Hit rates the tier would have at each capacity, for its traffic within the scope.

    ``method``: ``shards`` (LRU from sampled reuse distances) or ``mini`` (miniature
    simulations of ``policy``). ``sample_rate``: the rate now (a fixed-size tracker lowers it
    as distinct blocks pass its bound). ``current``: the curve at today's capacity (a point of
    the grid). ``accesses``: requests seen in the scope; ``sampled``: how many of them the
    curve is built from (fewer than about a thousand: read it as rough). ``observed_hit_rate``:
    the tier's real hit rate on the same requests, when the feeder said which hit (None
    otherwise). ``namespaces``: the scope, None for the whole tier.
    """

    tier: str
    policy: str
    method: Method
    sample_rate: float
    points: tuple[Point, ...]
    current: Point
    accesses: int
    sampled: int
    tracked_keys: int
    observed_hit_rate: float | None
    namespaces: tuple[str, ...] | None = None

    def at(self, capacity: float) -> float:
        """The hit rate at ``capacity`` bytes (:func:`interpolate`)."""
        return interpolate(self.points, capacity)


def interpolate(points: Sequence[Point], capacity: float) -> float:
    """The hit rate at ``capacity`` bytes, linear in log capacity between ``points`` (sorted
    by capacity); the end points' rates outside them."""
    caps = [p.capacity_bytes for p in points]
    i = bisect.bisect_left(caps, capacity)
    if i == 0:
        return points[0].hit_rate
    if i == len(caps):
        return points[-1].hit_rate
    (c0, h0), (c1, h1) = points[i - 1], points[i]
    t = math.log(capacity / c0) / math.log(c1 / c0)
    return h0 + t * (h1 - h0)
