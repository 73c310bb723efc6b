"""Prometheus series of a node in a cluster, read from its last heartbeat at scrape time
(a scrape never waits on Redis): ``kvstore_cluster_redis_up`` (1 while Redis answers, 0 while
the node is degraded), ``kvstore_cluster_nodes{state}``,
``kvstore_cluster_index_pending_placements`` (was ``kvstore_cluster_index_pending``) and the
counters ``kvstore_cluster_index_published_total``, ``..._resyncs_total``,
``..._dropped_total`` and ``..._swept_total``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.protocol.cluster import NodeState

if TYPE_CHECKING:
    from kvstore.cluster.node import ClusterNode

RENAMED = {"kvstore_cluster_index_pending_placements": "kvstore_cluster_index_pending"}


class ClusterCollector(Collector):
    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        status = self._node.status()
        yield GaugeMetricFamily("kvstore_cluster_redis_up", "1 while Redis answers this node",
                                value=float(status.redis.connected))
        nodes = GaugeMetricFamily("kvstore_cluster_nodes", "nodes listed, by state",
                                  labels=["state"])
        for state in NodeState:
            nodes.add_metric([state.value], float(sum(n.state is state for n in status.nodes)))
        yield nodes
        index = status.index
        yield GaugeMetricFamily("kvstore_cluster_index_pending_placements", "block placements "
                                "not yet published", value=float(index.pending))
        for name, value, text in (
                ("published", index.published, "block placements published"),
                ("resyncs", index.resyncs, "full republications of what the node holds"),
                ("dropped", index.dropped, "placements dropped while Redis was away"),
                ("swept", index.swept, "index records of forgotten nodes removed")):
            yield CounterMetricFamily(f"kvstore_cluster_index_{name}", text, value=float(value))
