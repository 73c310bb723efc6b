"""The engine worker's Prometheus metrics at ``GET /metrics``: its request and token counters,
the engine's prefix hits (local and from kvstore), its batch and cache state, and histograms
of time to first token and inter-token latency as the engine produced them.

Counters and gauges are read from the worker's ``/stats`` document at scrape time; the
histograms are observed by the engine thread as each step's tokens come out
(:meth:`WorkerMetrics.token`).

Series (``kvstore_worker_`` prefix, labelled ``role``): ``requests_total``,
``prefills_total``, ``generated_tokens_total``, ``cached_tokens_total``, ``prompt_tokens_total``,
``local_hit_tokens_total``, ``store_hit_tokens_total``, ``computed_tokens_total``,
``preemptions_total``, ``steps_total``, ``store_<op>_total`` (the kvstore connector's lookups,
hit, loaded and saved blocks, errors), ``running_requests``, ``waiting_requests``,
``inflight_requests``, ``free_blocks``; ``kvstore_worker_ttft_seconds``,
``kvstore_worker_itl_seconds``. The three ``..._requests`` gauges were ``running``, ``waiting``
and ``inflight``: those names are exported too for one release (``RENAMED``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engines.decoder.scheduler import Sequence
from engines.messages import WorkerStats
from server.renamed_metrics import RenamingRegistry

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
COUNTERS = ("requests", "prefills", "generated_tokens", "cached_tokens")
ENGINE_COUNTERS = ("prompt_tokens", "local_hit_tokens", "store_hit_tokens", "computed_tokens",
                   "preemptions", "steps")
ENGINE_GAUGES = ("running", "waiting", "free_blocks")
# a stats key -> its metric name, where the key lacks the unit
NAMES = {"running": "running_requests", "waiting": "waiting_requests",
         "inflight": "inflight_requests"}
RENAMED = {f"kvstore_worker_{new}": f"kvstore_worker_{key}" for key, new in NAMES.items()}


class WorkerCollector(Collector):
    """The worker's stats document as metric families, read at each scrape."""

    def __init__(self, stats: Callable[[], WorkerStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        doc, engine = stats.model_dump(), stats.engine.model_dump()  # a family per field
        role = [stats.role]
        rows: list[tuple[str, str, Any]] = [(k, "counter", doc[k]) for k in COUNTERS]
        rows += [(k, "counter", engine[k]) for k in ENGINE_COUNTERS]
        if stats.engine.kvstore is not None:
            rows += [(f"store_{k}", "counter", v) for k, v in stats.engine.kvstore]
        rows += [(k, "gauge", engine[k]) for k in ENGINE_GAUGES]
        rows.append(("inflight", "gauge", stats.inflight))
        for key, kind, value in rows:
            name = f"kvstore_worker_{NAMES.get(key, key)}"
            family = (CounterMetricFamily(name, key, labels=["role"]) if kind == "counter"
                      else GaugeMetricFamily(name, key, labels=["role"]))
            family.add_metric(role, float(value))
            yield family


class WorkerMetrics:
    """The worker's registry and its latency histograms."""

    def __init__(self, stats: Callable[[], WorkerStats]) -> None:
        self.registry = RenamingRegistry(RENAMED)
        self.registry.register(WorkerCollector(stats))
        self.ttft = Histogram("kvstore_worker_ttft_seconds", "arrival to first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("kvstore_worker_itl_seconds", "between consecutive tokens",
                             buckets=ITL_BUCKETS, registry=self.registry)

    def token(self, seq: Sequence, last: float | None) -> float:
        """``seq`` produced a token; ``last`` is when its previous one came out (None: this
        is its first). Returns now, the ``last`` of its next token."""
        now = time.perf_counter()
        if last is None:
            self.ttft.observe((seq.first_token_at or now) - seq.arrival)
        else:
            self.itl.observe(now - last)
        return now
