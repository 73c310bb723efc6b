"""The planner's Prometheus metrics (one registry of its own): pool sizes and pressure per
judgement, moves and recommendations, the worker count last recommended per pool, which
an autoscaler can act on, and what the last cache report priced twice each tier at."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from engines.planner.cache import CacheReport
from engines.planner.observe import PoolView
from engines.planner.policy import Decision


class PlannerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.workers = Gauge("kvstore_planner_pool_workers", "workers in the pool",
                             ["pool"], registry=r)
        self.pressure = Gauge("kvstore_planner_pool_pressure", "the pool's load against its "
                              "targets (above 1: over target)", ["pool"], registry=r)
        self.moves = Counter("kvstore_planner_moves", "workers moved into the pool",
                             ["pool"], registry=r)
        self.recommendations = Counter("kvstore_planner_recommendations",
                                       "scale recommendations made", ["pool"], registry=r)
        self.recommended = Gauge("kvstore_planner_recommended_workers", "the pool's size in "
                                 "the last recommendation", ["pool"], registry=r)
        self.cache_saved = Gauge("kvstore_planner_cache_saved_prefill_seconds_per_hour",
                                 "prefill seconds an hour twice the tier's capacity would "
                                 "save at today's traffic (the last cache report)", ["tier"],
                                 registry=r)

    def serve(self, port: int) -> None:
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def observe(self, pools: dict[str, PoolView], pressure: dict[str, float]) -> None:
        for name, p in pools.items():
            self.workers.labels(name).set(len(p.workers))
            self.pressure.labels(name).set(pressure[name])

    def acted(self, decision: Decision) -> None:
        if decision.event == "move":
            self.moves.labels(decision.pool).inc()
            return
        self.recommendations.labels(decision.pool).inc()
        for name, n in decision.desired.items():
            self.recommended.labels(name).set(n)

    def cached(self, report: CacheReport) -> None:
        for tier, row in report.tiers.items():
            if row.next_step.prefill_s_per_hour is not None:
                self.cache_saved.labels(tier).set(row.next_step.prefill_s_per_hour)
