"""Reads that reach the whole cluster, on real ``kvstore serve`` nodes and a real
``redis-server`` (and a real three-master Redis Cluster): a chain one node holds comes
byte-identical from another (socket get, shared memory, lookup), a stale index record is a miss
and is removed, a holder killed with ``kill -9`` before or during reads costs misses within a
bounded time and never an error or a wrong byte, a restarted node is read from again, a tenant
reads through a peer only its own blocks, and a node without the cluster's token nothing."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.keys import TIER_CODES
from kvstore.cluster.link import connect
from kvstore.protocol.cluster import ClusterStatus, NodeState
from kvstore.testing.redis_server import RedisCluster, RedisServer
from kvstore.testing.server import ServerProc
from tests.cluster.conftest import wait_for
from tests.cluster.test_serve_cluster import BEAT

pytestmark = pytest.mark.slow
B = 4096
LAYOUT = {"model_id": "m", "block_size": 16}


def status(node: ServerProc, token: str | None = None) -> ClusterStatus:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(node.url + "/v1/cluster", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return ClusterStatus.model_validate(r.json())


def start_fleet(tmp_path: Path, *extra: str) -> tuple[RedisServer, list[ServerProc]]:
    redis = RedisServer(tmp_path / "redis").start()
    nodes = [ServerProc(tmp_path / f"n{i}", "--cluster", redis.url, "--node-id", f"n{i}",
                        "--cluster-heartbeat-s", BEAT, *extra) for i in range(3)]
    for node in nodes:
        node.start()
    return redis, nodes


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[RedisServer, list[ServerProc]]]:
    redis, nodes = start_fleet(tmp_path)
    try:
        wait_for(lambda: [n.state for n in status(nodes[0]).nodes] == [NodeState.UP] * 3)
        yield redis, nodes
    finally:
        for node in nodes:
            node.stop()
        redis.stop()


def published(redis: RedisServer, node: ServerProc, ns: str, hashes: list[bytes],
              token: str | None = None) -> bool:
    slot = status(node, token).slot
    index = ClusterIndex(connect(redis.url)[0], 16)
    return all(any(h.slot == slot for h in hs) for hs in index.where(ns, hashes))


def stored(redis: RedisServer, node: ServerProc, n: int, token: str | None = None, *,
           name: str = "chat", admin: str | None = None) -> tuple[list[bytes], list[bytes]]:
    """``n`` random blocks put on ``node`` in namespace ``chat`` with ``token``, returned once
    the index says that it holds them all (under the store's ``name``; its status asked with
    ``admin``, else ``token``)."""
    chain = [os.urandom(32) for _ in range(n)]
    blocks = [os.urandom(B) for _ in chain]
    with KVStoreClient(node.url, token) as c:
        c.register_namespace("chat", B, LAYOUT)
        c.put("chat", chain, blocks)
    wait_for(lambda: published(redis, node, name, chain, admin or token))
    return chain, blocks


def read(node: ServerProc, chain: list[bytes], token: str | None = None) -> list[bytes | None]:
    """``chain`` read from ``node``'s namespace ``chat`` (registered first) with ``token``."""
    with KVStoreClient(node.url, token) as c:
        c.register_namespace("chat", B, LAYOUT)
        return c.get("chat", chain)


def test_a_chain_on_one_node_comes_byte_identical_from_the_others(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, n1, n2) = fleet
    chain, blocks = stored(redis, n1, 24)
    with KVStoreClient(n0.url, use_shm=False, transport="tcp") as c:  # socket get
        c.register_namespace("chat", B, LAYOUT)
        assert c.get("chat", chain) == blocks
        assert c.lookup("chat", chain)[0] == 24  # now held here
    assert status(n0).fetched.blocks == 24 and status(n0).fetched.bytes == 24 * B
    with KVStoreClient(n2.url) as c:  # over the Unix socket: shared-memory grants
        c.register_namespace("chat", B, LAYOUT)
        assert c.lookup("chat", chain[:10])[0] == 10
        dest = [bytearray(B) for _ in chain]
        assert c.get_into("chat", chain, dest) == [True] * 24
        assert [bytes(d) for d in dest] == blocks
    r = httpx.get(f"{n2.url}/v1/blocks/chat/{chain[0].hex()}", timeout=10)
    assert r.status_code == 200 and r.content == blocks[0]
    # a chain only partly held anywhere: the held run comes, the rest is a miss
    longer = chain[:5] + [os.urandom(32) for _ in range(3)]
    with KVStoreClient(n0.url) as c:
        assert c.get("chat", longer) == blocks[:5] + [None] * 3
    # blocks of four 64 KiB slots landing in a slab whose free slots are scattered (every
    # other one of a namespace of one-slot blocks deleted): each arrives in pieces, whole
    small, big = 64 << 10, 256 << 10
    with KVStoreClient(n2.url, use_shm=False, transport="tcp") as c:
        c.register_namespace("frag", small, LAYOUT)
        scattered = [os.urandom(32) for _ in range(16)]
        c.put("frag", scattered, [os.urandom(small) for _ in scattered])
        assert c.delete("frag", scattered[::2]) == 8
    with KVStoreClient(n1.url) as c:
        c.register_namespace("big", big, LAYOUT)
        large = [os.urandom(32) for _ in range(2)]
        large_blocks = [os.urandom(big) for _ in large]
        c.put("big", large, large_blocks)
    wait_for(lambda: published(redis, n1, "big", large))
    with KVStoreClient(n2.url, use_shm=False, transport="tcp") as c:
        c.register_namespace("big", big, LAYOUT)
        assert c.get("big", large) == large_blocks
        assert c.lookup("big", large)[1] == ["host", "host"]


def test_a_stale_record_is_a_miss_and_is_removed(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, n1, _) = fleet
    with KVStoreClient(n1.url) as c:
        c.register_namespace("chat", B, LAYOUT)
    ghost = [os.urandom(32) for _ in range(3)]
    index = ClusterIndex(connect(redis.url)[0], 16)
    # records of both n0 and n1 that are false: n1, asked by n0, must not turn to n0 (which
    # would turn to n1 again...): a peer's read is served from what the node holds
    for node in (n0, n1):
        index.publish(status(node).slot or 0, [("chat", h, TIER_CODES["host"]) for h in ghost])
    with KVStoreClient(n0.url) as c:
        c.register_namespace("chat", B, LAYOUT)
        started = time.monotonic()
        assert c.get("chat", ghost) == [None] * 3
        assert time.monotonic() - started < 3
    slot0 = status(n0).slot
    assert [[h.slot for h in hs] for hs in index.where("chat", ghost)] == [[slot0]] * 3


def test_a_holder_killed_costs_a_bounded_miss_never_an_error(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, n1, n2) = fleet
    chain, blocks = stored(redis, n1, 8)
    n1.kill()  # still "up" in the index for a moment: the read must find out by itself
    with KVStoreClient(n0.url) as c:
        c.register_namespace("chat", B, LAYOUT)
        started = time.monotonic()
        assert c.get("chat", chain) == [None] * 8
        assert time.monotonic() - started < 10
    # a copy elsewhere is used: n2 takes the chain from n0... which has none; put it on n2
    with KVStoreClient(n2.url) as c:
        c.register_namespace("chat", B, LAYOUT)
        c.put("chat", chain, blocks)
    wait_for(lambda: published(redis, n2, "chat", chain))
    with KVStoreClient(n0.url) as c:
        assert c.get("chat", chain) == blocks


def test_a_tenant_reads_through_a_peer_only_its_own_blocks(tmp_path: Path) -> None:
    tokens = tmp_path / "tenants.json"
    tokens.write_text(json.dumps({"a": "tok-a", "b": "tok-b"}))
    tokens.chmod(0o600)
    peer = tmp_path / "peer.token"
    peer.write_text("peer-secret")
    peer.chmod(0o600)
    redis, nodes = start_fleet(tmp_path, "--tenant-tokens-file", str(tokens),
                               "--cluster-token-file", str(peer))
    n0, n1, _ = nodes
    try:
        wait_for(lambda: len(status(n0, "peer-secret").nodes) == 3)
        chain, blocks = stored(redis, n1, 6, "tok-a", name="a~chat", admin="peer-secret")
        assert read(n0, chain, "tok-b") == [None] * 6  # b's own "chat" is another namespace
        assert read(n0, chain, "tok-a") == blocks
    finally:
        for node in nodes:
            node.stop()
        redis.stop()


def test_a_node_without_the_clusters_token_reads_nothing_from_it(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    nodes = []
    for name, secret in (("n0", "right-secret"), ("n1", "right-secret"), ("x", "wrong")):
        path = tmp_path / f"{name}.token"
        path.write_text(secret)
        path.chmod(0o600)
        nodes.append(ServerProc(tmp_path / name, "--cluster", redis.url, "--node-id", name,
                                "--cluster-heartbeat-s", BEAT, "--cluster-token-file",
                                str(path)).start())
    n0, n1, x = nodes
    try:
        wait_for(lambda: len(status(n0, "right-secret").nodes) == 3)
        chain, blocks = stored(redis, n0, 4, "right-secret")
        assert read(x, chain, "wrong") == [None] * 4  # its peer reads are refused by n0
        assert read(n1, chain, "right-secret") == blocks
    finally:
        for node in nodes:
            node.stop()
        redis.stop()


def test_a_restarted_node_is_read_from_again(
        fleet: tuple[RedisServer, list[ServerProc]], tmp_path: Path) -> None:
    redis, (n0, n1, _) = fleet
    chain = [os.urandom(32) for _ in range(6)]
    blocks = [os.urandom(B) for _ in chain]
    with KVStoreClient(n1.url) as c:
        c.register_namespace("chat", B, LAYOUT)
        c.put("chat", chain, blocks)
    n1.restart()  # SIGTERM: it leaves (gone at once), spills to disk, comes back, republishes
    wait_for(lambda: {n.node_id: n.state for n in status(n0).nodes}["n1"] is NodeState.UP)
    wait_for(lambda: published(redis, n1, "chat", chain))
    with KVStoreClient(n0.url) as c:
        c.register_namespace("chat", B, LAYOUT)
        assert c.get("chat", chain) == blocks
    # a node without a host tier keeps what it reads from a peer on disk
    disk_only = ServerProc(tmp_path / "n3", "--cluster", redis.url, "--node-id", "n3",
                           "--cluster-heartbeat-s", BEAT, host_capacity="0").start()
    try:
        wait_for(lambda: status(disk_only).redis.connected)
        with KVStoreClient(disk_only.url) as c:
            c.register_namespace("chat", B, LAYOUT)
            assert c.get("chat", chain) == blocks
            assert c.lookup("chat", chain)[1] == ["disk"] * len(chain)
    finally:
        disk_only.stop()


def test_reads_going_on_while_the_holder_is_killed_get_right_bytes_or_misses(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, n1, _) = fleet
    chain, blocks = stored(redis, n1, 16)
    results: list[list[bytes | None]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        with KVStoreClient(n0.url, use_shm=False, transport="tcp") as c:
            c.register_namespace("chat", B, LAYOUT)
            while not stop.is_set():
                try:
                    results.append(c.get("chat", chain))
                    c.delete("chat", chain)  # read from the peer again next time
                except BaseException as exc:  # any error fails the test
                    errors.append(exc)
                    return
    thread = threading.Thread(target=reader)
    thread.start()
    wait_for(lambda: len(results) >= 3)
    n1.kill()
    seen = len(results)
    wait_for(lambda: len(results) >= seen + 5, timeout=30)
    stop.set()
    thread.join(30)
    assert not errors
    assert results[0] == blocks
    for got in results:  # each block right or a miss, never another block's bytes
        assert all(g is None or g == b for g, b in zip(got, blocks, strict=True))
    assert results[-1] == [None] * 16


def test_a_chain_crosses_nodes_over_a_redis_cluster(redis_cluster: RedisCluster,
                                                    tmp_path: Path) -> None:
    nodes = [ServerProc(tmp_path / f"n{i}", "--cluster", redis_cluster.url, "--node-id",
                        f"rc{i}", "--cluster-heartbeat-s", BEAT).start() for i in range(2)]
    n0, n1 = nodes
    try:
        wait_for(lambda: status(n0).redis.cluster_mode and len(status(n0).nodes) >= 2)
        chain = [os.urandom(32) for _ in range(20)]
        blocks = [os.urandom(B) for _ in chain]
        with KVStoreClient(n1.url) as c:
            c.register_namespace("chat", B, LAYOUT)
            c.put("chat", chain, blocks)
        time.sleep(0.5)
        with KVStoreClient(n0.url) as c:
            c.register_namespace("chat", B, LAYOUT)
            wait_for(lambda: c.get("chat", chain) == blocks)
        assert status(n0).fetched.blocks == 20
    finally:
        for node in nodes:
            node.stop()
