"""What the planner sees of the fleet: each worker's role, queue and finished requests, and
from them each pool's latency at the chosen percentile over a sliding window.

The router's ``/stats`` names the workers and whether they are up; each worker's ``/latency``
(:mod:`engines.worker_control`) gives the requests it finished since the last look and its
queue (requests waiting for a batch slot). A pool is the workers of one role:
``prefill``, or ``decode`` (which also takes ``both``). Samples are filed under the worker's
role when they were read, and a worker's samples are dropped when its role changes, so a
moved worker is judged afresh in its new pool.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx
from pydantic import ValidationError

from engines.messages import LatencyReport, RouterStats, WorkerInfo

POOLS = ("prefill", "decode")
ITL_MIN_TOKENS = 8  # a mean over fewer gaps is noise (the first steps share a batch with prefills)


def pool_of(role: str) -> str:
    return "prefill" if role == "prefill" else "decode"


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100] of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(slots=True)
class WorkerSeen:
    url: str
    role: str = "both"
    up: bool = False
    kvstore: bool = False
    inflight: int = 0
    waiting: int = 0
    cursor: int = 0
    prefill_rate: float | None = None  # prompt tokens a second it measured (None: not yet)
    # (at, kind, ttft_s, itl_s, tokens) of finished requests, oldest first
    samples: deque[tuple[float, str, float, float | None, int]] = field(default_factory=deque)


class PoolView(NamedTuple):
    """One pool at one judgement. Latencies are ``None`` with too few samples."""

    name: str
    workers: list[str]
    samples: int
    ttft_s: float | None
    itl_s: float | None
    queue: float  # waiting requests per worker

    def pressure(self, ttft_target: float, itl_target: float, max_queue: float,
                 computes_prompts: bool) -> float:
        """The pool's load against its targets: above 1 is over target. The decode pool's
        time to first token counts only when it computes prompts itself (no prefill pool):
        behind a prefill pool it is a load from kvstore, and its waits show in its queue."""
        parts = [self.queue / max_queue]
        if self.ttft_s is not None and computes_prompts:
            parts.append(self.ttft_s / ttft_target)
        if self.itl_s is not None and self.name == "decode":
            parts.append(self.itl_s / itl_target)
        return max(parts)


class FleetView:
    """The workers as last seen, and each pool's view of them at a judgement. No I/O: the
    :class:`Observer` fills it from HTTP, the simulator (:mod:`engines.simulator.pools`)
    from its simulated workers."""

    def __init__(self, *, window_s: float, percentile: float, min_samples: int) -> None:
        self.window_s, self.pct, self.min_samples = window_s, percentile, min_samples
        self.workers: dict[str, WorkerSeen] = {}

    def set_role(self, url: str, role: str) -> None:
        """Record a switch the planner made (the worker's next report confirms it)."""
        w = self.workers[url]
        if w.role != role:
            w.role = role
            w.samples.clear()

    def pools(self, now: float | None = None) -> dict[str, PoolView]:
        now = time.time() if now is None else now
        out = {}
        for name in POOLS:
            members = [w for w in self.workers.values() if w.up and pool_of(w.role) == name]
            ttfts: list[float] = []
            itls: list[float] = []
            for w in members:
                while w.samples and w.samples[0][0] < now - self.window_s:
                    w.samples.popleft()
                for _, _, ttft, itl, tokens in w.samples:
                    ttfts.append(ttft)
                    if itl is not None and tokens >= ITL_MIN_TOKENS:
                        itls.append(itl)
            enough = len(ttfts) >= self.min_samples
            out[name] = PoolView(
                name, sorted(w.url for w in members), len(ttfts),
                percentile(ttfts, self.pct) if enough else None,
                percentile(itls, self.pct) if len(itls) >= self.min_samples else None,
                sum(w.waiting for w in members) / len(members) if members else 0.0)
        return out

    def prefill_rate(self) -> float | None:
        """The prompt tokens a second one worker computes: the mean of the prefill pool's
        measured rates, or of every live worker's without a prefill pool (None: none
        measured yet)."""
        up = [w for w in self.workers.values() if w.up]
        prefill = [w for w in up if w.role == "prefill"] or up
        rates = [w.prefill_rate for w in prefill if w.prefill_rate]
        return sum(rates) / len(rates) if rates else None

    def donor(self, pool: str, to_role: str) -> str | None:
        """The least busy live worker of ``pool`` that can take ``to_role``."""
        ok = [w for w in self.workers.values() if w.up and pool_of(w.role) == pool
              and (to_role != "prefill" or w.kvstore)]
        return min(ok, key=lambda w: (w.inflight + w.waiting, w.url)).url if ok else None


class Observer:
    """Keeps a :class:`FleetView` current from the router's and the workers' HTTP routes;
    owned by the planner's asyncio loop."""

    def __init__(self, client: httpx.AsyncClient, router: str, *, window_s: float,
                 percentile: float, min_samples: int) -> None:
        self.client, self.router = client, router.rstrip("/")
        self.view = FleetView(window_s=window_s, percentile=percentile,
                              min_samples=min_samples)

    async def refresh(self) -> None:
        """Read the router's worker list, then each live worker's latencies and queue.
        Raises ``httpx.HTTPError`` when the router does not answer."""
        r = await self.client.get(f"{self.router}/stats", timeout=5.0)
        r.raise_for_status()
        try:
            listed = RouterStats.model_validate_json(r.content).workers
        except ValidationError as exc:  # a router's answer, or nothing the planner can use
            raise httpx.HTTPError(f"{self.router}/stats is not a router's answer: {exc}") \
                from None
        workers = self.view.workers
        for url, seen in listed.items():
            w = workers.setdefault(url, WorkerSeen(url))
            w.up = seen.up
            w.prefill_rate = seen.rates.get("prefill_tokens_per_s")
        for url in list(workers):
            if url not in listed:
                del workers[url]
        for w in workers.values():
            if w.up:
                await self._read(w)

    async def _read(self, w: WorkerSeen) -> None:
        try:
            if not w.kvstore:
                r = await self.client.get(f"{w.url}/info", timeout=5.0)
                w.kvstore = WorkerInfo.model_validate_json(r.content).kvstore
            r = await self.client.get(f"{w.url}/latency", params={"since": w.cursor},
                                      timeout=5.0)
            lat = LatencyReport.model_validate_json(r.content)
        except (httpx.HTTPError, ValidationError):  # no answer, or not a worker's
            w.up = False
            return
        if lat.role != w.role:
            w.samples.clear()  # judged afresh in its new pool
        w.role, w.cursor = lat.role, lat.cursor
        for f in lat.finished:
            w.samples.append((f.at, f.kind, f.ttft_s, f.itl_s, f.tokens))
        w.inflight, w.waiting = lat.inflight, lat.waiting
