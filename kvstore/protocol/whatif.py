"""The ``/v1/whatif`` answer: one tier's miss-ratio curve (the hit rate it would have at
capacities around today's) for the whole tier or the namespaces the asker may see, built by
:class:`kvstore.whatif.WhatIfTracker`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kvstore.protocol.stats import Count
from kvstore.whatif import Curve


class WhatIfPoint(BaseModel):
    capacity_bytes: Count
    hit_rate: float = Field(ge=0, le=1)


class WhatIfOut(BaseModel):
    """A tier's curve for one scope of its traffic."""

    tier: str
    policy: str = Field(description="the eviction policy the curve is for")
    method: Literal["shards", "mini"] = Field(
        description="shards: LRU from sampled reuse distances; mini: miniature simulations")
    sample_rate: float = Field(gt=0, le=1, description="fraction of block hashes sampled now")
    points: list[WhatIfPoint] = Field(description="hit rate at each capacity, smallest first")
    current: WhatIfPoint = Field(description="the curve at the tier's capacity today")
    accesses: Count = Field(description="requests the curve covers")
    sampled: Count = Field(description="of those, the sampled ones it is built from")
    tracked_keys: Count = Field(description="blocks the tier's tracker follows now")
    observed_hit_rate: float | None = Field(
        default=None, ge=0, le=1, description="the tier's real hit rate on the same requests")
    namespaces: list[str] | None = Field(
        default=None, description="the scope; null: every namespace of the tier")

    @classmethod
    def from_curve(cls, curve: Curve) -> WhatIfOut:
        return cls(
            tier=curve.tier, policy=curve.policy, method=curve.method,
            sample_rate=curve.sample_rate,
            points=[WhatIfPoint(capacity_bytes=p.capacity_bytes, hit_rate=p.hit_rate)
                    for p in curve.points],
            current=WhatIfPoint(capacity_bytes=curve.current.capacity_bytes,
                                hit_rate=curve.current.hit_rate),
            accesses=curve.accesses, sampled=curve.sampled, tracked_keys=curve.tracked_keys,
            observed_hit_rate=curve.observed_hit_rate,
            namespaces=None if curve.namespaces is None else list(curve.namespaces))
