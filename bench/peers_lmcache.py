"""LMCache in multi-process mode: one ``lmcache server`` (a RAM L1, 1 GiB unless a case shrinks
it, and a filesystem L2)
and vLLM's ``LMCacheMPConnector`` in each engine.

LMCache runs from ``.peers/lmcache`` (``make peers``: the wheel and three small async-file
packages with ``--no-deps``); what it imports beyond them (torch, numba, zmq, msgpack) is
already in vLLM's venv. Its in-engine ``LMCacheConnectorV1`` has no CPU path ("No supported cpu
connector"), so the MP mode is the one an operator of a CPU engine can run. Without
``--supported-transfer-mode auto`` the engine waits 300 s for ``register_kv_caches``.

On a CPU engine its connector moves the KV with the engine-driven transfer by default, which
refuses a hybrid model's several KV groups at start ("engine-driven transfer does not support
multiple KV transfer groups now"); ``LMCACHE_MP_TRANSFER_MODE=lmcache_driven`` in the bench's
environment (every engine inherits it) selects LMCache's shared-memory path instead, which
runs there. The JSON's params record the mode.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from peers_store import RAM_BYTES, PeerStore, TiedProc, dist_version, free_port, peer_path, wait_tcp

from kvstore.testing.proc import ChildProc, http_ok

CHUNK_TOKENS = 256  # LMCache's unit of storage: a prefix hits in whole chunks
MQ_TIMEOUT_S = 60


class LMCachePeer(PeerStore):
    name = "lmcache"
    processes = ("lmcache server",)
    llvmlite_fix = True

    def __init__(self, workdir: Any, ram_bytes: int = RAM_BYTES, offload: bool = False) -> None:
        super().__init__(workdir, ram_bytes, offload)
        self.port, self.http_port = free_port(), free_port()
        self.site = peer_path("lmcache")
        self.server: ChildProc = TiedProc(
            "lmcache server",
            self.workdir / "server.log",
            env={"PYTHONPATH": str(self.site), "LMCACHE_TRACK_USAGE": "false"},
        )

    def missing(self) -> str | None:
        if not (self.site / "lmcache" / "cli" / "main.py").exists():
            return f"not installed in {self.site} (run `make peers`)"
        return None

    def version(self) -> str | None:
        return dist_version(self.site, "lmcache")

    def start(self) -> None:
        l2 = {"type": "fs", "base_path": str(self.workdir / "l2")}
        self.server.spawn(
            [
                sys.executable,
                "-m",
                "lmcache.cli.main",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--http-port",
                str(self.http_port),
                "--chunk-size",
                str(CHUNK_TOKENS),
                "--l1-size-gb",
                str(self.ram_bytes / 2**30),  # LMCache's "GB" are GiB
                "--eviction-policy",
                "LRU",
                "--supported-transfer-mode",
                "auto",
                "--l2-adapter",
                json.dumps(l2),
                "--disable-observability",
            ]
        )
        wait_tcp(self.server, self.port)
        # the zmq port opens before the HTTP one; both mean the server is up
        http = f"http://127.0.0.1:{self.http_port}/"
        if not self.server.wait_until(lambda: http_ok(http), time.monotonic() + 60):
            raise RuntimeError(f"lmcache server's HTTP port did not answer:\n{self.server.log()}")

    def stop(self) -> None:
        self.server.stop(timeout=30)

    def connector(self) -> dict[str, Any]:
        return {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://127.0.0.1",
                "lmcache.mp.port": self.port,
                "lmcache.mp.mq_timeout": MQ_TIMEOUT_S,
            },
        }

    def engine_env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.site), "LMCACHE_TRACK_USAGE": "false"}

    def pids(self) -> list[int]:
        return [] if self.server.proc is None else [self.server.proc.pid]
