"""The store's series for Prometheus, read from ``store.stats()`` and ``store.health()`` at
each scrape: counters and gauges per tier, per namespace and in total, whether each tier is
up, and the back-end counters a tier reports (the S3 tier's write-back queue and faults).

Names: ``kvstore_<name>`` for totals, ``kvstore_tier_<name>{tier}``,
``kvstore_namespace_<name>{namespace}``, where a field's name is its key in the stats but for
those ``NAMES`` gives a unit to (``bytes_in`` is ``received_bytes``, ``pinned`` is
``pinned_blocks``, ``hit_rate`` is ``hit_ratio``...); ``kvstore_up`` and
``kvstore_tier_up{tier}`` (1 or 0); ``kvstore_tier_backend_<name>{tier}`` for a tier's back-end
counters (``BACKEND``); ``kvstore_tier_corrupt_dropped_by_cause_total{tier,cause}``.
``RENAMED`` maps each new family name to the one it had before (still exported for one
release: :mod:`server.renamed_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.protocol.health import StoreHealth
from kvstore.protocol.stats import Counts, StoreStats, TierStats, TotalStats
from kvstore.store.counters import COUNTERS

GAUGES = ("hit_rate", "blocks", "bytes", "capacity_bytes", "logical_bytes", "occupancy",
          "charged_bytes", "pinned", "pinned_bytes")
# a stats key -> its metric name, where the key lacks the unit (or puts it first)
NAMES = {"bytes_in": "received_bytes", "bytes_out": "sent_bytes", "hit_rate": "hit_ratio",
         "occupancy": "occupancy_ratio", "pinned": "pinned_blocks"}
BACKEND_NAMES = {"pending": "pending_blocks"}
# a tier's back-end document (the S3 tier's ``stats()``): key -> (kind, help)
BACKEND = {
    "pending": ("gauge", "blocks queued for upload (write-back queue depth)"),
    "pending_bytes": ("gauge", "bytes queued for upload"),
    "queue_bytes": ("gauge", "capacity of the write-back queue in bytes"),
    "degraded": ("gauge", "1 while the back end fails (reads then miss without asking it)"),
    "uploaded": ("counter", "blocks uploaded"),
    "errors": ("counter", "failed back-end requests"),
    "dropped": ("counter", "uploads given up after retries"),
    "corrupt": ("counter", "objects whose body failed their checksum"),
    "recoveries": ("counter", "times the back end recovered from a fault"),
    "discovered": ("counter", "blocks adopted from other nodes"),
}
# the rows of each scope: totals, per tier, per namespace
SCOPES = (("", TotalStats), ("tier_", TierStats), ("namespace_", Counts))
# new family name -> old (counters without ``_total``), for the fields each scope has
RENAMED = {f"kvstore_{scope}{new}": f"kvstore_{scope}{key}"
           for scope, row in SCOPES for key, new in NAMES.items() if key in row.model_fields} | {
    f"kvstore_tier_backend_{new}": f"kvstore_tier_backend_{key}"
    for key, new in BACKEND_NAMES.items()}
Stats = Callable[[], StoreStats]
Health = Callable[[], StoreHealth]


def _family(name: str, kind: str, text: str,
            labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, text, labels=labels)
    return GaugeMetricFamily(name, text, labels=labels)


class StoreCollector(Collector):
    """``store.stats()`` as metric families; a family is emitted only where some row has
    its key (a tenant's view has no tiers, a namespace no occupancy)."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        # each row as its numbers by field name: a family per field, a series per row
        scopes = (("", None, {"": stats.totals.model_dump(exclude_none=True)}),
                  ("tier_", "tier", {name: row.model_dump(exclude_none=True)
                                     for name, row in stats.tiers.items()}),
                  ("namespace_", "namespace", {name: row.model_dump()
                                               for name, row in stats.namespaces.items()}))
        for prefix, label, groups in scopes:
            for key in COUNTERS + GAUGES:
                rows = [(g, v[key]) for g, v in groups.items() if key in v]
                if not rows:
                    continue
                family = _family(f"kvstore_{prefix}{NAMES.get(key, key)}",
                                 "counter" if key in COUNTERS else "gauge",
                                 f"{key} ({label or 'total'})", [label] if label else [])
                for group, value in rows:
                    family.add_metric([group] if label else [], float(value))
                yield family
        yield from self._backends(stats.tiers)
        yield from self._corrupt(stats.tiers)

    @staticmethod
    def _corrupt(tiers: dict[str, TierStats]) -> Iterator[Metric]:
        """Blocks dropped for a failed checksum, by tier and by where it was found."""
        rows = [(t, cause, n) for t, v in tiers.items()
                for cause, n in v.corrupt_by_cause.items()]
        if rows:
            family = CounterMetricFamily(
                "kvstore_tier_corrupt_dropped_by_cause",
                "blocks dropped for a failed checksum, by tier and cause (read, send, client, "
                "demote)", labels=["tier", "cause"])
            for tier, cause, n in rows:
                family.add_metric([tier, cause], float(n))
            yield family

    @staticmethod
    def _backends(tiers: dict[str, TierStats]) -> Iterator[Metric]:
        for key, (kind, text) in BACKEND.items():
            rows = [(t, v.backend[key]) for t, v in tiers.items()
                    if v.backend is not None and key in v.backend]
            if rows:
                family = _family(f"kvstore_tier_backend_{BACKEND_NAMES.get(key, key)}", kind,
                                 text, ["tier"])
                for tier, value in rows:
                    family.add_metric([tier], float(value))
                yield family


class HealthCollector(Collector):
    """``kvstore_up`` (the store serves) and ``kvstore_tier_up{tier}`` from
    ``store.health()``; a probe that raises reads as down, never as a failed scrape."""

    def __init__(self, health: Health) -> None:
        self._health = health

    def collect(self) -> Iterator[Metric]:
        try:
            health = self._health()
        except Exception:
            health = StoreHealth(ok=False)
        up = GaugeMetricFamily("kvstore_up", "1 when the store can serve")
        up.add_metric([], float(health.ok))
        yield up
        tiers = GaugeMetricFamily("kvstore_tier_up", "1 when the tier's back end serves",
                                  labels=["tier"])
        for name, tier in health.tiers.items():
            tiers.add_metric([name], float(tier.ok))
        yield tiers
