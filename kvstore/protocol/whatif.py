"""The ``/v1/whatif`` answer: one tier's miss-ratio curve (the hit rate it would have at
capacities around today's) for the whole tier or the namespaces the asker may see, built by
:class:`kvstore.whatif.WhatIfTracker`, and on demand the capacity advisor's prices
(:mod:`kvstore.whatif.advice`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kvstore.protocol.stats import Count
from kvstore.whatif import Curve
from kvstore.whatif.advice import Advice, Step


class WhatIfPoint(BaseModel):
    capacity_bytes: Count
    hit_rate: float = Field(ge=0, le=1)


class StepOut(BaseModel):
    """A capacity above today's and what it would add at today's traffic."""

    capacity_bytes: Count
    hit_rate: float = Field(ge=0, le=1)
    hits_per_hour: float = Field(description="more blocks served an hour")
    tokens_per_hour: float = Field(description="fewer prefill tokens an hour (namespaces whose "
                                   "layout names a block_size)")
    prefill_s_per_hour: float | None = Field(
        default=None, description="fewer prefill seconds an hour; null without a prefill rate")

    @classmethod
    def from_step(cls, step: Step) -> StepOut:
        return cls(capacity_bytes=step.capacity_bytes, hit_rate=min(1.0, max(0.0, step.hit_rate)),
                   hits_per_hour=step.hits_per_hour, tokens_per_hour=step.tokens_per_hour,
                   prefill_s_per_hour=step.prefill_s_per_hour)


class AdviceOut(BaseModel):
    """What the next steps of the tier's capacity would save."""

    window_s: float = Field(ge=0, description="seconds of traffic the curves cover")
    requests_per_hour: float = Field(ge=0, description="the scope's requests an hour today")
    prefill_tokens_per_s: float | None = Field(
        default=None, description="the engine's prefill rate the seconds are priced at")
    next_step: StepOut = Field(description="twice today's capacity")
    steps: list[StepOut] = Field(description="every point of the curve above today's capacity")
    unpriced: list[str] = Field(description="namespaces whose layout names no block_size: "
                                "counted in hits, not in tokens")

    @classmethod
    def from_advice(cls, advice: Advice, unpriced: list[str]) -> AdviceOut:
        return cls(window_s=advice.window_s, requests_per_hour=advice.requests_per_hour,
                   prefill_tokens_per_s=advice.prefill_tokens_per_s,
                   next_step=StepOut.from_step(advice.next_step),
                   steps=[StepOut.from_step(s) for s in advice.steps], unpriced=unpriced)


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
    tracked_keys: Count | None = Field(
        default=None, description="blocks the tier's tracker follows now (the admin's view)")
    observed_hit_rate: float | None = Field(
        default=None, ge=0, le=1, description="the tier's real hit rate on the same requests")
    namespaces: list[str] | None = Field(
        default=None, description="the scope; null: every namespace of the tier")
    advice: AdviceOut | None = Field(default=None, description="the capacity advisor's "
                                     "prices (asked with advise=true)")

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
