"""A node beside a real store, over a real ``redis-server`` (and a real Redis Cluster): what it
holds is in the index within the publish interval, in the tier it is in; Redis going away
degrades the node without stopping it, and Redis coming back empty gets everything again."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.cluster.index import ClusterIndex, Holder
from kvstore.cluster.keys import ORPHANS, SWEEPER, TIER_CODES
from kvstore.cluster.link import connect
from kvstore.cluster.members import Membership
from kvstore.cluster.node import ClusterNode
from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.protocol.cluster import NodeState
from kvstore.store import Store
from kvstore.testing.redis_server import RedisCluster, RedisServer
from tests.cluster.conftest import quick, wait_for

B = 4096
NS = Namespace("m", B, Layout(model_id="tiny", block_size=16))
HOST, DISK = TIER_CODES["host"], TIER_CODES["disk"]



@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    made: list[Store] = []

    def build(name: str) -> Store:
        store = Store(StoreConfig((
            TierConfig("host", 8 * B, options={"slot_bytes": B}),
            TierConfig("disk", 64 * B, options={"path": str(tmp_path / name / "lmdb")}),
        ), namespaces_path=str(tmp_path / name / "ns.json")))
        store.register_namespace(NS)
        made.append(store)
        return store

    yield build
    for store in made:
        store.close()


def tiers_of(index: ClusterIndex, slot: int, hashes: list[bytes]) -> list[int | None]:
    """The tier code ``slot`` is recorded with for each hash (None: not recorded)."""
    return [next((h.tier for h in holders if h.slot == slot), None)
            for holders in index.where(NS.name, hashes)]


def test_what_a_node_holds_is_published_with_its_tier(
        redis_server: RedisServer, make_store: Callable[[str], Store]) -> None:
    store = make_store("a")
    node = ClusterNode(quick(redis_server.url, "a"), store, "test")
    node.start()
    try:
        index = ClusterIndex(connect(redis_server.url)[0], 16)
        wait_for(lambda: node.status().redis.connected)  # joined, beaten, listed
        slot = node.status().slot
        assert slot is not None
        first = [os.urandom(32) for _ in range(4)]
        store.put(NS.name, first, [os.urandom(B)] * 4)
        wait_for(lambda: tiers_of(index, slot, first) == [HOST] * 4)
        more = [os.urandom(32) for _ in range(20)]  # the host tier holds 8: the rest demote
        store.put(NS.name, more, [os.urandom(B)] * 20)
        assert store.settled(10)
        wait_for(lambda: set(tiers_of(index, slot, first + more)) == {HOST, DISK})
        assert tiers_of(index, slot, first) == [DISK] * 4  # the oldest went down
        store.delete(NS.name, more[:5])
        wait_for(lambda: tiers_of(index, slot, more[:5]) == [None] * 5)
        wait_for(lambda: [n.blocks for n in node.status().nodes] == [19])  # the next beat
        status = node.status()
        assert status.redis.connected and not status.redis.degraded
        assert [(n.node_id, n.state) for n in status.nodes] == [("a", NodeState.UP)]
        assert status.index.pending == 0
        assert {t.name for t in status.nodes[0].tiers} == {"host", "disk"}
    finally:
        node.close()
    index = ClusterIndex(connect(redis_server.url)[0], 16)
    assert index.where(NS.name, more[5:6]) == [[Holder(slot, DISK)]]  # kept for a restart
    members = Membership(connect(redis_server.url)[0], quick(redis_server.url, "b"))
    assert {n.node_id: n.state for n in members.roster().nodes} == {"a": NodeState.GONE}


def test_redis_away_degrades_the_node_and_back_empty_gets_everything_again(
        redis_server: RedisServer, make_store: Callable[[str], Store]) -> None:
    store = make_store("a")
    node = ClusterNode(quick(redis_server.url, "a", max_pending=16), store, "test")
    node.start()
    try:
        wait_for(lambda: node.status().redis.connected)  # joined, beaten, listed
        before = [os.urandom(32) for _ in range(6)]
        store.put(NS.name, before, [os.urandom(B)] * 6)
        wait_for(lambda: node.status().index.pending == 0 and node.status().index.published >= 6)
        redis_server.stop()
        wait_for(lambda: node.status().redis.degraded)
        status = node.status()
        assert not status.redis.connected and status.redis.error and status.nodes == []
        during = [os.urandom(32) for _ in range(30)]  # more than max_pending: notes dropped
        data = [os.urandom(B) for _ in range(30)]
        store.put(NS.name, during, data)  # the store serves as it would alone
        assert store.get(NS.name, during[-4:]) == data[-4:]
        redis_server.start()  # on the same port, empty: a restart without persistence
        index = ClusterIndex(connect(redis_server.url)[0], 16)
        wait_for(lambda: node.status().redis.connected)
        slot = node.status().slot
        assert slot is not None
        held = [h for h in before + during if store.contains(NS.name, h)]
        assert len(held) == 36
        wait_for(lambda: all(tiers_of(index, slot, held)), timeout=15)
        status = node.status()
        assert status.index.resyncs >= 2 and status.index.dropped > 0
        assert [n.state for n in status.nodes] == [NodeState.UP]
    finally:
        node.close()


def test_two_nodes_see_each_other_and_one_stopping_is_gone(
        redis_server: RedisServer, make_store: Callable[[str], Store]) -> None:
    a = ClusterNode(quick(redis_server.url, "a"), make_store("a"), "test")
    b = ClusterNode(quick(redis_server.url, "b"), make_store("b"), "test")
    a.start()
    b.start()
    try:
        wait_for(lambda: [n.state for n in a.status().nodes] == [NodeState.UP] * 2)
        assert a.status().slot != b.status().slot
        b.close()
        wait_for(lambda: {n.node_id: n.state for n in a.status().nodes}
                 == {"a": NodeState.UP, "b": NodeState.GONE}, timeout=3)
    finally:
        a.close()
        b.close()


def test_a_node_on_a_redis_cluster(redis_cluster: RedisCluster,
                                   make_store: Callable[[str], Store]) -> None:
    store = make_store("a")
    node = ClusterNode(quick(redis_cluster.url, "rc-a"), store, "test")
    node.start()
    try:
        wait_for(lambda: node.status().redis.connected)  # joined, beaten, listed
        status = node.status()
        assert status.redis.cluster_mode and status.redis.connected
        hashes = [os.urandom(32) for _ in range(40)]
        store.put(NS.name, hashes, [os.urandom(B)] * 40)
        index = ClusterIndex(connect(redis_cluster.url)[0], 16)
        slot = status.slot
        assert slot is not None
        wait_for(lambda: all(tiers_of(index, slot, hashes)))
        assert "rc-a" in {n.node_id for n in node.status().nodes}
    finally:
        node.close()


@pytest.mark.parametrize("backend", ["redis_server", "redis_cluster"])
def test_a_forgotten_nodes_records_are_swept_and_no_others(
        backend: str, request: pytest.FixtureRequest,
        make_store: Callable[[str], Store]) -> None:
    redis: RedisServer | RedisCluster = request.getfixturevalue(backend)
    client = connect(redis.url)[0]
    client.delete(ORPHANS, SWEEPER)  # the module's Redis Cluster is shared between tests
    stores = {name: make_store(name) for name in ("a", "b")}
    nodes = {name: ClusterNode(quick(redis.url, f"sw-{backend}-{name}", forget_after_s=1.5),
                               store, "test") for name, store in stores.items()}
    held = {name: [os.urandom(32) for _ in range(6)] for name in nodes}
    shared = [os.urandom(32) for _ in range(4)]  # held by both: one record each
    index = ClusterIndex(client, 16)
    try:
        for name, node in nodes.items():
            node.start()
            stores[name].put(NS.name, held[name] + shared, [os.urandom(B)] * 10)
        wait_for(lambda: all(n.status().index.published >= 10 for n in nodes.values()))
        slots = {name: node.status().slot for name, node in nodes.items()}
        # (on the shared Redis Cluster, the nodes of earlier tests are forgotten and swept
        # first; a, should it stop while it sweeps them, would hold the walk for 30 s)
        wait_for(lambda: not client.exists(SWEEPER) and not client.scard(ORPHANS))
        nodes["a"]._stop.set()  # silent from now on: it neither beats nor says it leaves
        for thread in nodes["a"]._threads:
            thread.join()
        wait_for(lambda: index.where(NS.name, held["a"]) == [[]] * 6)  # forgotten, swept
        # the sweep walks the buckets one master at a time: the shared blocks' records of a
        # may lie in a bucket it reaches later, so the check waits for the walk to end
        wait_for(lambda: not client.exists(SWEEPER) and not client.scard(ORPHANS))
        assert [[h.slot for h in hs] for hs in index.where(NS.name, shared + held["b"])] \
            == [[slots["b"]]] * 10
        assert nodes["b"].status().index.swept >= 10
        assert [n.node_id for n in nodes["b"].status().nodes] == [f"sw-{backend}-b"]
    finally:
        for node in nodes.values():
            node.close()
