"""The planner's cache report: beside the prefill/decode split, what more kvstore capacity
would save. Every ``cache_report_s`` it asks the kvstore server's capacity advisor
(``GET /v1/whatif?advise=true``) for each of its tiers, pricing misses at the prefill rate the
fleet measures (the mean of its prefill workers' ``prefill_tokens_per_s``, or of every
worker's with no prefill pool; the server's own setting while none is measured), and prints
one JSON line: ``{"event": "cache", "prefill_tokens_per_s": ..., "pools": {...}, "tiers":
{tier: {"capacity_bytes", "hit_rate", "next_step": {...}}}}``.

The split decides how many workers compute prompts; the cache decides how many prompts they
compute at all: with both in one report an operator sees whether a second prefill worker or
twice the host tier buys more.
"""

from __future__ import annotations

import logging
from typing import Literal

import httpx
from pydantic import BaseModel, Field, ValidationError

from engines.access import bearer
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.whatif import StepOut, WhatIfOut

log = logging.getLogger(__name__)


class TierAdvice(BaseModel):
    """One tier in a cache report: today's capacity and hit rate, its requests an hour, and
    what twice the capacity would save."""

    capacity_bytes: int
    hit_rate: float
    requests_per_hour: float
    next_step: StepOut


class CacheReport(BaseModel):
    """The planner's cache report, one JSON line (``event`` ``cache``)."""

    event: Literal["cache"] = "cache"
    prefill_tokens_per_s: float | None = Field(description="the fleet's measured prefill "
                                               "rate the seconds are priced at")
    pools: dict[str, int] = Field(description="workers in each pool")
    tiers: dict[str, TierAdvice]


class CacheAdvisor:
    """Reads the advice of the kvstore server at ``url`` (token ``token``) at most every
    ``every_s`` seconds."""

    def __init__(self, client: httpx.AsyncClient, url: str, token: str | None,
                 every_s: float) -> None:
        self.client, self.url, self.every_s = client, url.rstrip("/"), every_s
        self.headers = bearer(token)
        self._next = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next

    async def read(self, now: float, prefill_tokens_per_s: float | None,
                   pools: dict[str, int]) -> CacheReport | None:
        """The report (None when the server does not answer: logged, asked again at the next
        period)."""
        self._next = now + self.every_s
        try:
            r = await self.client.get(f"{self.url}/healthz", headers=self.headers, timeout=5.0)
            # a tenant's token lists no tiers (they are shared): its own curve in the top one
            tiers: list[str | None] = [*StoreHealth.model_validate_json(r.content).tiers] \
                or [None]
            out: dict[str, TierAdvice] = {}
            for tier in tiers:
                params: dict[str, str] = {"advise": "true"} | ({"tier": tier} if tier else {})
                if prefill_tokens_per_s:
                    params["prefill_tokens_per_s"] = str(prefill_tokens_per_s)
                r = await self.client.get(f"{self.url}/v1/whatif", params=params,
                                          headers=self.headers, timeout=10.0)
                r.raise_for_status()
                curve = WhatIfOut.model_validate_json(r.content)
                if curve.advice is None:
                    raise httpx.HTTPError(f"{self.url}/v1/whatif gave no advice")
                out[curve.tier] = TierAdvice(
                    capacity_bytes=curve.current.capacity_bytes,
                    hit_rate=round(curve.current.hit_rate, 4),
                    requests_per_hour=round(curve.advice.requests_per_hour),
                    next_step=curve.advice.next_step)
        except (httpx.HTTPError, ValidationError) as exc:
            log.warning("kvstore %s gave no capacity advice: %s", self.url, exc)
            return None
        return CacheReport(prefill_tokens_per_s=prefill_tokens_per_s, pools=pools, tiers=out)
