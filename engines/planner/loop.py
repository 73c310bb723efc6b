"""The planner's loop: every ``interval_s`` look at the fleet (:mod:`engines.planner.observe`),
decide (:mod:`engines.planner.policy`) and act: a move is ``POST /admin/role`` on the chosen
worker (the router learns the new role from the worker within a second, and a request that
reaches the worker under its old role is retried elsewhere); a recommendation is one JSON line
on stdout and the ``kvstore_planner_recommended_workers`` gauge. With ``kvstore`` set, a cache
report (:mod:`engines.planner.cache`) joins them every ``cache_report_s``.

Every action (and with ``log_ticks`` every judgement) is one JSON line on stdout, so that an
autoscaler, a log shipper or a bench can follow it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import httpx

from engines.access import bearer
from engines.planner.cache import CacheAdvisor
from engines.planner.metrics import PlannerMetrics
from engines.planner.observe import Observer
from engines.planner.policy import Action, Policy
from engines.planner.settings import PlannerSettings

log = logging.getLogger(__name__)


class Planner:
    def __init__(self, settings: PlannerSettings, token: str | None = None,
                 out: TextIO | None = None, metrics: PlannerMetrics | None = None,
                 kvstore_token: str | None = None) -> None:
        self.s, self.token, self.out = settings, token, out or sys.stdout
        self.policy = Policy(settings)
        self.metrics = metrics
        # the token goes with every call: the router's /stats and the workers' routes too
        self.client = httpx.AsyncClient(timeout=30.0, headers=bearer(token))
        self.observer = Observer(self.client, settings.router, window_s=settings.window_s,
                                 percentile=settings.percentile,
                                 min_samples=settings.min_samples)
        self.cache = None if settings.kvstore is None else CacheAdvisor(
            self.client, settings.kvstore, kvstore_token, settings.cache_report_s)
        self.started = time.time()

    def emit(self, doc: dict[str, Any]) -> None:
        now = time.time()
        doc = {"t": round(now - self.started, 3), "at": round(now, 3), **doc}
        self.out.write(json.dumps(doc) + "\n")
        self.out.flush()

    async def connect(self) -> None:
        """The first look at the fleet, before the loop. Raises ``httpx.HTTPError`` when the
        router does not answer or is not a router: a planner pointed at nothing stops at
        once, while a router that fails after this first answer is retried (see
        :meth:`tick`)."""
        await self.observer.refresh()

    async def tick(self) -> Action | None:
        try:
            await self.observer.refresh()
        except httpx.HTTPError as exc:
            log.warning("router %s did not answer: %s", self.s.router, exc)
            return None
        now = time.time()
        pools = self.observer.view.pools(now)
        press = self.policy.pressures(pools)
        if self.metrics:
            self.metrics.observe(pools, press)
        if self.s.log_ticks:
            self.emit({"event": "tick", **{
                name: {"workers": len(p.workers), "ttft_s": p.ttft_s, "itl_s": p.itl_s,
                       "queue": p.queue, "samples": p.samples, "pressure": round(press[name], 3)}
                for name, p in pools.items()}})
        if self.cache is not None and self.cache.due(now):
            report = await self.cache.read(now, self.observer.view.prefill_rate(),
                                           {name: len(p.workers) for name, p in pools.items()})
            if report is not None:
                if self.metrics:
                    self.metrics.cached(report)
                self.emit(report.model_dump())
        action = self.policy.decide(pools, now)
        if action is None:
            return None
        decision = action.decision()
        if action.kind == "move":  # a pool's name is the role its workers take
            assert action.donor is not None
            url = self.observer.view.donor(action.donor, action.pool)
            if url is None:
                decision = decision.model_copy(update={
                    "event": "recommend",
                    "reason": decision.reason + "; no donor worker can take the role"})
            else:
                decision = decision.model_copy(update={"worker": url})
                if not self.s.dry_run and not await self.switch(url, action.pool):
                    return None
        if self.metrics:
            self.metrics.acted(decision)
        self.emit(decision.model_dump(exclude_unset=True))
        return action

    async def switch(self, url: str, role: str) -> bool:
        try:
            r = await self.client.post(f"{url}/admin/role", json={"role": role})
        except httpx.HTTPError as exc:
            log.warning("switching %s to %s failed: %s", url, role, exc)
            return False
        if r.status_code != 200:
            log.warning("switching %s to %s refused: %s %s", url, role, r.status_code, r.text)
            return False
        self.observer.view.set_role(url, role)
        return True

    async def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        end = self.started + self.s.duration_s if self.s.duration_s else float("inf")
        try:
            while not stop() and time.time() < end:
                started = time.monotonic()
                await self.tick()
                await asyncio.sleep(max(0.0, self.s.interval_s - (time.monotonic() - started)))
        finally:
            await self.client.aclose()
