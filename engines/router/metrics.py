"""The router's Prometheus metrics at ``GET /metrics``: routing decisions by policy, outcome
and worker, prompt and prefix-hit tokens, each worker's state, and histograms of time to first
token and inter-token latency as the router sees them (from the request to the worker's first
token, and between tokens).

Counters are read from :meth:`Router.stats` at scrape time, so the routing code carries no
metrics calls. The latencies need each token's arrival: :class:`RouterMetrics` is one of the
router's ``token_observers``, which its ``stream`` (the path every OpenAI request takes) calls
with each token's gap.

Series: ``kvstore_router_decisions_total{policy,worker,outcome}`` (``routed``: served;
``failed``: the worker failed it and the request moved on; ``no_worker``, worker ``none``:
every worker failed), ``kvstore_router_requests_total{policy}``,
``kvstore_router_retries_total``, ``kvstore_router_prompt_tokens_total{worker}``,
``kvstore_router_hit_tokens_total{worker}``, ``kvstore_router_store_prefix_tokens_total``,
``kvstore_router_worker_up{worker,role}``,
``kvstore_router_worker_inflight_requests{worker}`` (was ``kvstore_router_worker_inflight``,
still exported for one release: ``RENAMED``), ``kvstore_router_worker_queued_tokens{worker}``,
``kvstore_router_worker_resident_blocks{worker}``, ``kvstore_router_ttft_seconds``,
``kvstore_router_itl_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engines.router.core import Router
from server.renamed_metrics import RenamingRegistry

# seconds: a tiny CPU model answers in milliseconds, a real one in tenths to seconds
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
RENAMED = {"kvstore_router_worker_inflight_requests": "kvstore_router_worker_inflight"}


class RoutingCollector(Collector):
    """:meth:`Router.stats` as metric families, read at each scrape."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[Metric]:
        stats = self._router.stats()
        policy, workers = stats.policy, stats.workers
        decisions = CounterMetricFamily("kvstore_router_decisions",
                                        "routing decisions by outcome",
                                        labels=["policy", "worker", "outcome"])
        for url, w in workers.items():
            decisions.add_metric([policy, url, "routed"], w.routed)
            decisions.add_metric([policy, url, "failed"], w.failures)
        decisions.add_metric([policy, "none", "no_worker"], stats.failed)
        yield decisions
        requests = CounterMetricFamily("kvstore_router_requests", "requests served",
                                       labels=["policy"])
        requests.add_metric([policy], stats.requests)
        yield requests
        yield CounterMetricFamily("kvstore_router_retries",
                                  "attempts moved to another worker", value=stats.retries)
        yield CounterMetricFamily("kvstore_router_store_prefix_tokens",
                                  "prompt tokens kvstore held when routed",
                                  value=stats.store_prefix_tokens)
        rows = {url: w.model_dump() for url, w in workers.items()}  # a family per field
        # (stats key, metric name, kind, help)
        per_worker = (
            ("prompt_tokens", "prompt_tokens", "counter", "prompt tokens routed"),
            ("hit_tokens", "hit_tokens", "counter", "prefix tokens the worker did not compute"),
            ("inflight", "worker_inflight_requests", "gauge", "requests running"),
            ("queued_tokens", "worker_queued_tokens", "gauge", "estimated tokens of work running"),
            ("resident_blocks", "worker_resident_blocks", "gauge",
             "blocks the router knows the worker holds"))
        for key, metric, kind, text in per_worker:
            name = f"kvstore_router_{metric}"
            family = (CounterMetricFamily(name, text, labels=["worker"]) if kind == "counter"
                      else GaugeMetricFamily(name, text, labels=["worker"]))
            for url, row in rows.items():
                family.add_metric([url], row[key])
            yield family
        up = GaugeMetricFamily("kvstore_router_worker_up", "1 while the worker takes requests",
                               labels=["worker", "role"])
        for url, w in workers.items():
            up.add_metric([url, w.role], float(w.up))
        yield up


class RouterMetrics:
    """The router's registry; observes the tokens of its streams."""

    def __init__(self, router: Router) -> None:
        self.registry = RenamingRegistry(RENAMED)
        self.registry.register(RoutingCollector(router))
        self.ttft = Histogram("kvstore_router_ttft_seconds", "request to first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("kvstore_router_itl_seconds", "between consecutive tokens",
                             buckets=ITL_BUCKETS, registry=self.registry)
        router.token_observers.append(self._token)

    def _token(self, gap_s: float, first: bool) -> None:
        (self.ttft if first else self.itl).observe(gap_s)

    def routes(self) -> APIRouter:
        api = APIRouter()

        @api.get("/metrics", response_class=Response)
        def metrics() -> Response:
            """Prometheus text exposition of the router's series."""
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

        return api
