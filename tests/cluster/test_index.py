"""The block index in a real Redis and a real three-master Redis Cluster: records per node,
replaced and removed by their own node only, answered per block in one round trip."""

from __future__ import annotations

import os

import pytest

from kvstore.cluster.index import ClusterIndex, Holder
from kvstore.cluster.keys import TIER_CODES
from kvstore.cluster.link import connect
from kvstore.testing.redis_server import RedisCluster, RedisServer

HOST, DISK = TIER_CODES["host"], TIER_CODES["disk"]


def exercise(index: ClusterIndex) -> None:
    chain = [os.urandom(32) for _ in range(300)]
    other = [os.urandom(32) for _ in range(5)]
    index.publish(1, [("ns", h, HOST) for h in chain])
    index.publish(2, [("ns", h, DISK) for h in chain[:10]])
    where = index.where("ns", chain + other)
    assert where[:10] == [[Holder(1, HOST), Holder(2, DISK)]] * 10
    assert where[10:300] == [[Holder(1, HOST)]] * 290
    assert where[300:] == [[]] * 5
    assert index.where("other-ns", chain[:3]) == [[]] * 3  # namespaces never mix
    # node 1 demotes one block and loses another; node 2's records stay as they were
    index.publish(1, [("ns", chain[0], DISK), ("ns", chain[1], None)])
    assert index.where("ns", chain[:2]) == [[Holder(2, DISK), Holder(1, DISK)],
                                            [Holder(2, DISK)]]
    index.correct(2, "ns", chain[:2])
    assert index.where("ns", chain[:2]) == [[Holder(1, DISK)], []]


@pytest.mark.parametrize("bits", [0, 4, 16])
def test_records_per_node_on_one_redis(redis_server: RedisServer, bits: int) -> None:
    client, _ = connect(redis_server.url)
    exercise(ClusterIndex(client, bits))
    if bits == 0:  # everything in one bucket: one key per namespace
        assert client.dbsize() == 1


def test_records_per_node_on_a_redis_cluster(redis_cluster: RedisCluster) -> None:
    client, clustered = connect(redis_cluster.url)
    assert clustered
    exercise(ClusterIndex(client, 16))
    keys_per_master = [int(s.cli("dbsize").strip()) for s in redis_cluster.servers]
    assert all(n > 0 for n in keys_per_master)  # the buckets spread over the shards
