"""Prometheus metrics: the store's counters read at scrape time, plus request counters and
latencies of both planes. One registry per server (not the global one), so that several
servers in one process (tests) never collide.

Series: ``kvstore_tier_<counter>`` labelled ``tier``, ``kvstore_namespace_<counter>``
labelled ``namespace``, ``kvstore_<counter>`` for totals, and
``kvstore_requests_total{plane,op,status}`` / ``kvstore_request_seconds{plane,op}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

COUNTERS = ("queries", "hits", "misses", "evictions", "promotions", "demotions",
            "corrupt_dropped")
GAUGES = ("hit_rate", "blocks", "bytes", "capacity_bytes")


class StoreCollector(Collector):
    """Turns ``store.stats()`` into metric families at each scrape."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        doc = self._stats()
        scopes = (("", None, {"": doc.get("totals", {})}),
                  ("tier_", "tier", doc.get("tiers", {})),
                  ("namespace_", "namespace", doc.get("namespaces", {})))
        for prefix, label, groups in scopes:
            labels = [label] if label else []
            for key in COUNTERS + GAUGES:
                name = f"kvstore_{prefix}{key}"
                family: CounterMetricFamily | GaugeMetricFamily
                if key in COUNTERS:
                    family = CounterMetricFamily(name, f"{key} ({label or 'total'})", labels=labels)
                else:
                    family = GaugeMetricFamily(name, f"{key} ({label or 'total'})", labels=labels)
                for group, values in groups.items():
                    if key in values:
                        family.add_metric([group] if label else [], float(values[key]))
                yield family


class ServerMetrics:
    """The registry a server exposes at ``/metrics``."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StoreCollector(stats))
        self.requests = Counter("kvstore_requests", "requests served", ["plane", "op", "status"],
                                registry=self.registry)
        self.latency = Histogram("kvstore_request_seconds", "request latency", ["plane", "op"],
                                 registry=self.registry,
                                 buckets=(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5))
        self.connections = Counter("kvstore_dataplane_connections", "data plane connections "
                                   "accepted", registry=self.registry)

    def observe(self, plane: str, op: str, status: str, seconds: float) -> None:
        self.requests.labels(plane, op, status).inc()
        self.latency.labels(plane, op).observe(seconds)


def tenant_registry(stats: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry of the store's series alone, over ``stats`` (a tenant's view): no request
    counters or latencies, which are every tenant's traffic."""
    registry = CollectorRegistry()
    registry.register(StoreCollector(stats))
    return registry
