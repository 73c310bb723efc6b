"""Fixtures for cluster tests: a real ``redis-server`` (and a real three-master Redis Cluster)
on loopback, and cluster settings with short timings so that states change within a test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.cluster.config import ClusterConfig
from kvstore.testing.redis_server import RedisCluster, RedisServer
from kvstore.testing.server import ServerProc


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("rc")).start()
    yield cluster
    cluster.stop()


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def quick(url: str, node_id: str, *, forget_after_s: float = 60.0,
          max_pending: int = 1 << 16, index_bits: int = 16) -> ClusterConfig:
    """A node's settings with timings a test can wait out (beats every 0.1 s)."""
    return ClusterConfig(url=url, node_id=node_id, address=f"127.0.0.1:{len(node_id)}",
                         heartbeat_s=0.1, suspect_after_s=0.5, gone_after_s=1.0,
                         forget_after_s=forget_after_s, publish_s=0.05,
                         max_pending=max_pending, index_bits=index_bits)


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Callable[..., ServerProc]]:
    """Factory for ``kvstore serve`` processes with their own flags; all stopped at the end."""
    made: list[ServerProc] = []

    def make(*args: str, name: str = "data") -> ServerProc:
        proc = ServerProc(tmp_path / name, *args)
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.stop()
