"""Three real ``kvstore serve`` nodes and one real ``redis-server`` on loopback: the nodes find
each other, publish what they hold, tell a node killed with ``kill -9`` from one that is up,
and keep serving (degraded, and saying so) while Redis is away."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.keys import TIER_CODES
from kvstore.cluster.link import connect
from kvstore.protocol.cluster import ClusterStatus, NodeState
from kvstore.testing.proc import ROOT
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.server import ServerProc, kvstore_cmd
from tests.cluster.conftest import wait_for

pytestmark = pytest.mark.slow
BEAT = "0.2"  # seconds: suspect after 0.6 s of silence, gone after 2 s


def kv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})



def status(node: ServerProc) -> ClusterStatus:
    r = httpx.get(node.url + "/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    return ClusterStatus.model_validate(r.json())


def states(node: ServerProc) -> dict[str, NodeState]:
    return {n.node_id: n.state for n in status(node).nodes}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[RedisServer, list[ServerProc]]]:
    redis = RedisServer(tmp_path / "redis").start()
    nodes = [ServerProc(tmp_path / f"n{i}", "--cluster", redis.url, "--node-id", f"n{i}",
                        "--cluster-heartbeat-s", BEAT) for i in range(3)]
    try:
        for node in nodes:
            node.start()
        yield redis, nodes
    finally:
        for node in nodes:
            node.stop()
        redis.stop()


def test_nodes_see_each_other_publish_what_they_hold_and_a_killed_one_goes(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, n1, n2) = fleet
    wait_for(lambda: states(n0) == {f"n{i}": NodeState.UP for i in range(3)})
    views = {n.node_id: n for n in status(n0).nodes}
    assert views["n1"].address == f"127.0.0.1:{n1.data_port}"
    assert {t.name for t in views["n1"].tiers} == {"host", "disk"}
    hashes = [os.urandom(32) for _ in range(12)]
    with KVStoreClient(n1.url) as c:
        c.register_namespace("chat", 4096, {"model_id": "m"})
        c.put("chat", hashes, [os.urandom(4096) for _ in hashes])
    index = ClusterIndex(connect(redis.url)[0], 16)
    slot = status(n1).slot
    wait_for(lambda: all(any(h.slot == slot and h.tier == TIER_CODES["host"] for h in hs)
                         for hs in index.where("chat", hashes)))
    wait_for(lambda: {n.node_id: n.blocks for n in status(n0).nodes}["n1"] == 12)
    out = kv("cluster", "status", "--url", n0.url)
    assert out.returncode == 0, out.stderr
    assert "n0 (slot" in out.stdout and "connected" in out.stdout
    assert all(f"n{i}" in out.stdout for i in range(3))
    n2.kill()
    seen: set[NodeState] = set()

    def gone() -> bool:
        seen.add(states(n0)["n2"])
        return NodeState.GONE in seen
    wait_for(gone, timeout=10)
    assert NodeState.SUSPECT in seen
    assert states(n0)["n1"] is NodeState.UP


def test_redis_away_the_nodes_serve_and_say_so(
        fleet: tuple[RedisServer, list[ServerProc]]) -> None:
    redis, (n0, _, _) = fleet
    wait_for(lambda: len(states(n0)) == 3)
    redis.stop()
    wait_for(lambda: status(n0).redis.degraded)
    out = kv("cluster", "status", "--url", n0.url)
    assert out.returncode == 1 and "DEGRADED" in out.stdout
    metrics = httpx.get(n0.url + "/metrics", timeout=10).text
    assert "kvstore_cluster_redis_up 0.0" in metrics
    hashes = [os.urandom(32) for _ in range(4)]
    blocks = [os.urandom(4096) for _ in hashes]
    with KVStoreClient(n0.url) as c:
        c.register_namespace("chat", 4096, {"model_id": "m"})
        c.put("chat", hashes, blocks)
        assert c.get("chat", hashes) == blocks
    redis.start()  # empty: every node joins again and republishes
    wait_for(lambda: not status(n0).redis.degraded and len(states(n0)) == 3)
    index = ClusterIndex(connect(redis.url)[0], 16)
    slot = status(n0).slot
    wait_for(lambda: all(any(h.slot == slot for h in hs) for hs in index.where("chat", hashes)))
    assert "kvstore_cluster_redis_up 1.0" in httpx.get(n0.url + "/metrics", timeout=10).text


def test_the_status_is_the_admins_and_a_node_alone_has_none(
        make_node: Callable[..., ServerProc], tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    try:
        node = make_node("--cluster", redis.url, "--tenant-tokens", '{"acme": "t-acme"}',
                         "--token", "admin-secret", "--cluster-token", "peer-secret", name="a")
        r = httpx.get(node.url + "/v1/cluster", headers={"Authorization": "Bearer t-acme"})
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        r = httpx.get(node.url + "/v1/cluster",
                      headers={"Authorization": "Bearer admin-secret"})
        assert r.status_code == 200
        assert r.json()["node_id"] == f"127.0.0.1:{node.data_port}"  # the address by default
        alone = make_node(name="b")
        r = httpx.get(alone.url + "/v1/cluster")
        assert r.status_code == 404 and "--cluster" in r.json()["message"]
    finally:
        redis.stop()


@pytest.mark.parametrize(("flags", "says"), [
    (["--cluster", "http://127.0.0.1:1"], "must start with redis://"),
    (["--cluster", "redis://127.0.0.1:1", "--data-port", "0"], "data_port"),
    (["--cluster", "redis://127.0.0.1:1", "--advertise", "nohost"], "HOST:PORT"),
    (["--cluster", "redis://127.0.0.1:1", "--token", "a-secret"], "cluster_token"),
])
def test_cluster_settings_that_cannot_work_are_one_line_and_exit_2(
        tmp_path: Path, flags: list[str], says: str) -> None:
    out = kv("serve", "--data-dir", str(tmp_path / "d"), *flags)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr


def test_a_password_in_the_url_is_never_shown(tmp_path: Path) -> None:
    out = kv("serve", "--data-dir", str(tmp_path / "d"), "--cluster",
             "http://user:hunter2@127.0.0.1:1")
    assert out.returncode == 2 and "hunter2" not in out.stderr + out.stdout
