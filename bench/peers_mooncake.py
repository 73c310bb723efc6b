"""Mooncake Store: a ``mooncake_master`` (with its HTTP metadata server), a ``mooncake_client``
that lends the store its RAM (1 GiB unless a case shrinks it), and vLLM's built-in
``MooncakeStoreConnector`` in each engine (``standalone-store`` mode, no memory of its own), all
over TCP on loopback.

The binaries and the ``mooncake.store`` module the connector imports come from
``.peers/mooncake`` (``make peers``: ``mooncake-transfer-engine-non-cuda`` with ``--no-deps``);
they link Debian's ``libibverbs1`` and ``libnl`` even when only TCP is used. By default the
store keeps blocks in RAM only, so a restart loses them. With ``offload`` its SSD tier is on:
``-enable_offload`` on the master and the client, the client's files under
``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``, and ``enable_offload`` in the engines' config, so that
a block evicted from the segment is still read from the client's disk.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from peers_store import (
    RAM_BYTES,
    PeerStore,
    TiedProc,
    dist_version,
    free_port,
    peer_path,
    wait_tcp,
)

ENGINE_BUFFER = "512MB"  # each engine's local transfer buffer
DISK_BYTES = 8 << 30  # the SSD tier, with ``offload``
# With ``offload`` (a small segment under pressure) the master evicts from 70% full, 10% at a
# time: from its default 90% and 5%, a 12 MiB prompt put into a full 64 MiB segment was refused
# ("insufficient space") before eviction made room, and those blocks were never stored.
PRESSURE_EVICTION = ("-eviction_high_watermark_ratio=0.7", "-eviction_ratio=0.1")


class MooncakePeer(PeerStore):
    name = "mooncake"
    processes = ("mooncake_master", "mooncake_client")

    def __init__(self, workdir: Path, ram_bytes: int = RAM_BYTES, offload: bool = False) -> None:
        super().__init__(workdir, ram_bytes, offload)
        self.site = peer_path("mooncake")
        self.rpc, self.meta, self.metrics, self.client_port = (free_port() for _ in range(4))
        self.master = TiedProc("mooncake_master", self.workdir / "master.log")
        self.disk = self.workdir / "ssd"
        self.client = TiedProc(
            "mooncake_client",
            self.workdir / "client.log",
            env=self._offload_env() if offload else None,
        )
        self.config = self.workdir / "mooncake.json"

    def _bin(self, name: str) -> Path:
        path = self.site / "mooncake" / name
        if path.exists() and not os.access(path, os.X_OK):  # pip --target may drop the bit
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def missing(self) -> str | None:
        master = self._bin("mooncake_master")
        if not master.exists() or not (self.site / "mooncake" / "store.so").exists():
            return f"not installed in {self.site} (run `make peers`)"
        probe = subprocess.run(
            [str(master), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        if probe.returncode != 0:  # e.g. libibverbs.so.1 missing: `make peers` installs it
            return f"mooncake_master does not run here: {probe.stderr.strip()[-300:]}"
        return None

    def version(self) -> str | None:
        return dist_version(self.site, "mooncake_transfer_engine_non_cuda")

    def start(self) -> None:
        self.master.spawn(
            [
                str(self._bin("mooncake_master")),
                "-rpc_port",
                str(self.rpc),
                "-rpc_address",
                "127.0.0.1",
                "-enable_http_metadata_server=true",
                "-http_metadata_server_host",
                "127.0.0.1",
                "-http_metadata_server_port",
                str(self.meta),
                "-metrics_host",
                "127.0.0.1",
                "-metrics_port",
                str(self.metrics),
                f"-enable_offload={str(self.offload).lower()}",
                *(PRESSURE_EVICTION if self.offload else ()),
            ]
        )
        wait_tcp(self.master, self.rpc)
        wait_tcp(self.master, self.meta)
        self.disk.mkdir(exist_ok=True)
        self.client.spawn(
            [
                str(self._bin("mooncake_client")),
                "-protocol",
                "tcp",
                "-global_segment_size",
                f"{self.ram_bytes >> 20} MB",  # Mooncake's MB are MiB
                f"-enable_offload={str(self.offload).lower()}",
                "-master_server_address",
                f"127.0.0.1:{self.rpc}",
                "-metadata_server",
                f"http://127.0.0.1:{self.meta}/metadata",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.client_port),
            ]
        )
        wait_tcp(self.client, self.client_port)
        self.config.write_text(
            json.dumps(
                {
                    "metadata_server": f"http://127.0.0.1:{self.meta}/metadata",
                    "master_server_address": f"127.0.0.1:{self.rpc}",
                    "protocol": "tcp",
                    "device_name": "",
                    "mode": "standalone-store",
                    "global_segment_size": 0,
                    "local_buffer_size": ENGINE_BUFFER,
                    "enable_offload": self.offload,
                }
            )
        )

    def _offload_env(self) -> dict[str, str]:
        """The client's SSD tier: its folder, 8 GiB of it (as kvstore's disk tier), and every
        block written to disk at the next offload pass, one pass a second. By default a pass
        runs every 10 s and writes only full buckets (256 MiB or 500 blocks): a small segment
        fills and evicts its blocks long before, and they are lost."""
        return {
            "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(self.disk),
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(DISK_BYTES),
            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(DISK_BYTES),
            "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1",
            "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "1",
        }

    def stop(self) -> None:
        self.client.stop(timeout=20)  # first: it unmounts its segment from the master
        self.master.stop(timeout=20)

    def connector(self) -> dict[str, Any]:
        return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}

    def engine_env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.site), "MOONCAKE_CONFIG_PATH": str(self.config)}

    def pids(self) -> list[int]:
        return [c.proc.pid for c in (self.master, self.client) if c.proc is not None]
