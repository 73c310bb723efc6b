"""The node's connection to Redis: one server or a Redis Cluster, found out by asking.

redis-py does the talking (connection pool, ``rediss://`` TLS, passwords in the URL, and for
a Redis Cluster the routing of each key to its shard). Every call has a short socket timeout,
so a Redis that stops answering costs a node a bounded wait, never a hang.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster

SOCKET_TIMEOUT_S = 2.0  # seconds any Redis call may take before it counts as a failure

RedisClient = redis.Redis | RedisCluster
RedisError = redis.RedisError  # what every failed call raises (timeouts and refusals too)


def connect(url: str) -> tuple[RedisClient, bool]:
    """A client for ``url`` and whether Redis is a Redis Cluster (asked once, by ``INFO
    cluster``). Raises :data:`RedisError` when Redis does not answer."""
    options: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT_S,
                               "socket_connect_timeout": SOCKET_TIMEOUT_S}
    single = redis.Redis.from_url(url, **options)
    try:
        clustered = bool(single.info("cluster").get("cluster_enabled"))
    except redis.RedisError:
        single.close()
        raise
    if not clustered:
        return single, False
    single.close()
    return RedisCluster.from_url(url, **options), True


def pipelines(client: RedisClient, keys: Iterable[str]) -> list[tuple[Pipeline, list[str]]]:
    """One plain pipeline per Redis server, with the keys of ``keys`` it owns. redis-py's own
    cluster pipeline refuses scripts; a plain pipeline on the shard that owns every key of it
    takes them, so a batch costs one round trip per shard. (A key that moved meanwhile fails
    the batch with ``RedisError``; the caller sends it again later, by then routed anew.)"""
    if not isinstance(client, RedisCluster):
        return [(client.pipeline(transaction=False), list(keys))]
    by_node: dict[str, list[str]] = defaultdict(list)
    nodes = {}
    for key in keys:
        node = client.get_node_from_key(key)
        by_node[node.name].append(key)
        nodes[node.name] = node
    return [(client.get_redis_connection(nodes[name]).pipeline(transaction=False), at)
            for name, at in by_node.items()]
