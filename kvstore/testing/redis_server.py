"""Throwaway Redis servers on loopback, for tests and benches: one ``redis-server``, or a
Redis Cluster of several masters made with ``redis-cli --cluster create``.

The binaries are Debian's (``redis-server``, and ``redis-cli`` from ``redis-tools``), which
``make test`` installs. Nothing is persisted: a stopped and started server is an empty one,
as a Redis restarted without persistence is.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

from kvstore.testing.proc import ChildProc, free_port

STARTUP_S = 20.0


def _cluster_port() -> int:
    """A free port ``p`` below the ephemeral range whose bus port ``p + 10000`` is free too (a
    cluster node listens on both)."""
    while True:
        port = random.randrange(20000, 30000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def redis_binary(name: str = "redis-server") -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists()
                                   else None)
    if found is None:
        raise FileNotFoundError(f"{name} not found: apt-get install redis-server (make test "
                                "installs it)")
    return found


class RedisServer(ChildProc):
    """One ``redis-server`` on a free loopback port over ``data_dir`` (its log beside it).
    ``stop()``/``start()`` restart it on the same port, empty."""

    grace_s = 5.0

    def __init__(self, data_dir: Path, *, cluster: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__("redis-server", self.data_dir.parent / f"{self.data_dir.name}.log",
                         cwd=self.data_dir)
        self.port = _cluster_port() if cluster else free_port()
        self.cluster = cluster

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.data_dir)]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     str(self.data_dir / "nodes.conf"), "--cluster-node-timeout", "2000"]
        self.spawn(args)
        if not self.wait_until(self.ping, time.monotonic() + STARTUP_S):
            self.kill()
            raise RuntimeError(f"redis-server did not start:\n{self.log()}")
        return self

    def ping(self) -> bool:
        return self.cli("ping").strip() == "PONG"

    def cli(self, *args: str) -> str:
        """``redis-cli -p PORT args`` (its output; empty if the server does not answer)."""
        done = subprocess.run([redis_binary("redis-cli"), "-p", str(self.port), *args],
                              capture_output=True, text=True, timeout=10, check=False)
        return done.stdout


class RedisCluster:
    """``masters`` Redis Cluster masters (no replicas) on loopback, all slots assigned."""

    def __init__(self, data_dir: Path, masters: int = 3) -> None:
        self.servers = [RedisServer(Path(data_dir) / f"m{i}", cluster=True)
                        for i in range(masters)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.servers[0].port}"

    def start(self) -> RedisCluster:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> RedisCluster:
        for server in self.servers:
            server.start()
        subprocess.run([redis_binary("redis-cli"), "--cluster", "create",
                        *[f"127.0.0.1:{s.port}" for s in self.servers],
                        "--cluster-replicas", "0", "--cluster-yes"],
                       capture_output=True, text=True, timeout=60, check=True)
        deadline = time.monotonic() + STARTUP_S
        while not all("cluster_state:ok" in s.cli("cluster", "info") for s in self.servers):
            if time.monotonic() > deadline:
                raise RuntimeError("Redis Cluster did not come up")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
