"""Prometheus metrics of one server: the store's series (:mod:`server.store_metrics`), request
counters and latencies of both planes, open connections by plane, ``kvstore_build_info`` and
prometheus-client's process, platform and GC collectors. One registry per server (not the
global one), so that several servers in one process (tests) never collide; it also exports the
renamed series under their old names for one release (``RENAMED``: :mod:`server.renamed_metrics`).

Series here: ``kvstore_requests_total{plane,op,status}``,
``kvstore_request_duration_seconds{plane,op}`` (was ``kvstore_request_seconds``),
``kvstore_connections_open{plane}`` (``rest``, ``tcp``, ``unix``),
``kvstore_dataplane_connections_total`` (accepted),
``kvstore_dataplane_connections_refused_total{reason}`` (the limit that refused one:
``max_connections``, ``max_connections_per_tenant``, ``max_pending_connections``),
``kvstore_build_info{version,protocol,python}``, ``process_*``, ``python_*``.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from kvstore import __version__
from kvstore.protocol.frame import PROTOCOL_VERSION
from server import cluster_metrics, store_metrics
from server.renamed_metrics import RenamingRegistry
from server.store_metrics import Health, HealthCollector, Stats, StoreCollector
from server.whatif_metrics import Curves, WhatIfCollector

__all__ = ["REFUSAL_REASONS", "RENAMED", "ServerMetrics", "tenant_registry"]

REFUSAL_REASONS = ("max_connections", "max_connections_per_tenant", "max_pending_connections")
# every series of a server that was renamed: new family name -> old
RENAMED = {"kvstore_request_duration_seconds": "kvstore_request_seconds",
           **store_metrics.RENAMED, **cluster_metrics.RENAMED}


class ConnectionsCollector(Collector):
    """``kvstore_connections_open{plane}``, each plane's count read at scrape time from the
    callable its listener registered."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], int]] = {}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("kvstore_connections_open", "open connections by plane",
                                   labels=["plane"])
        for plane, count in sorted(self.sources.items()):
            family.add_metric([plane], float(count()))
        yield family


class ServerMetrics:
    """The registry a server exposes at ``/metrics`` (the admin's view)."""

    def __init__(self, stats: Stats, health: Health | None = None,
                 curves: Curves | None = None) -> None:
        self.registry: CollectorRegistry = RenamingRegistry(RENAMED)
        self.registry.register(StoreCollector(stats))
        if health is not None:
            self.registry.register(HealthCollector(health))
        if curves is not None:
            self.registry.register(WhatIfCollector(curves))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info("kvstore_build", "the running kvstore", registry=self.registry).info(
            {"version": __version__, "protocol": str(PROTOCOL_VERSION),
             "python": platform.python_version()})
        self.requests = Counter("kvstore_requests", "requests served", ["plane", "op", "status"],
                                registry=self.registry)
        self.latency = Histogram("kvstore_request_duration_seconds", "request latency",
                                 ["plane", "op"], registry=self.registry,
                                 buckets=(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5))
        self.connections = Counter("kvstore_dataplane_connections", "data plane connections "
                                   "accepted", registry=self.registry)
        self.refused = Counter("kvstore_dataplane_connections_refused", "data plane "
                               "connections refused, by the limit that refused them",
                               ["reason"], registry=self.registry)
        for reason in REFUSAL_REASONS:  # each series from the start, at 0
            self.refused.labels(reason)
        self._open = ConnectionsCollector()
        self.registry.register(self._open)

    def observe(self, plane: str, op: str, status: str, seconds: float) -> None:
        self.requests.labels(plane, op, status).inc()
        self.latency.labels(plane, op).observe(seconds)

    def watch_connections(self, plane: str, count: Callable[[], int]) -> None:
        """Report ``count()`` as the open connections of ``plane`` at each scrape."""
        self._open.sources[plane] = count


def tenant_registry(stats: Stats) -> CollectorRegistry:
    """A registry of the store's series alone, over ``stats`` (a tenant's view): no request
    counters or latencies, which are every tenant's traffic."""
    registry = RenamingRegistry(store_metrics.RENAMED)
    registry.register(StoreCollector(stats))
    return registry
