"""The stores the peers bench races, behind one small face: start, stop, restart, the
connector an engine names, the environment it needs, and the processes an operator runs.

:class:`KVStorePeer` (``kvstore serve`` and :class:`connectors.vllm.KVStoreConnector`) lives
here; LMCache and Mooncake Store are in ``peers_lmcache`` and ``peers_mooncake``. A peer whose
install is impossible here says why in :meth:`PeerStore.missing` and the bench skips it with
that reason; a peer that is installed but fails to start is an error.
"""

from __future__ import annotations

import socket
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from kvstore.testing.proc import ROOT, ChildProc, free_port
from kvstore.testing.server import ServerProc

PEERS_DIR = ROOT / ".peers"  # where `make peers` installs them
STARTUP_S = 180.0  # a store's start on two shared cores, beside engines loading
RAM_BYTES = 1 << 30  # each store's RAM tier, unless a case shrinks it


class Usage(NamedTuple):
    """What a store's processes hold now: resident memory and CPU time, children included."""

    rss_bytes: int
    cpu_s: float


def usage(pids: list[int]) -> Usage:
    """RSS and user+system CPU seconds of ``pids`` and their children (gone ones count 0)."""
    rss, cpu = 0, 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                rss += p.memory_info().rss
                t = p.cpu_times()
                cpu += t.user + t.system
        except psutil.Error:
            continue
    return Usage(rss, cpu)


def tcp_open(port: int) -> bool:
    """Whether something accepts connections on loopback ``port`` now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_tcp(child: ChildProc, port: int, timeout_s: float = STARTUP_S) -> None:
    """Wait until ``child`` listens on ``port``; RuntimeError with its log if it exits or
    stays silent (then it is killed)."""
    if child.wait_until(lambda: tcp_open(port), time.monotonic() + timeout_s):
        return
    rc = None if child.proc is None else child.proc.poll()
    child.kill()
    raise RuntimeError(
        f"{child.name} {'exited ' + str(rc) if rc is not None else 'hung'}:\n{child.log()}"
    )


class TiedProc(ChildProc):
    """A store process that dies with the bench, however the bench ends."""

    tied = True


class PeerStore(ABC):
    """One store, its processes started in ``workdir`` (data, logs, config files), with
    ``ram_bytes`` of RAM tier (kvstore's host tier, LMCache's L1, Mooncake's segment);
    ``offload`` turns on a disk tier where the store's is optional (Mooncake's SSD tier;
    kvstore's and LMCache's are always on)."""

    name: str
    processes: tuple[str, ...]  # what an operator runs beside the engines
    llvmlite_fix = False  # the engine must apply peers_engine's llvmlite fix

    def __init__(self, workdir: Path, ram_bytes: int = RAM_BYTES, offload: bool = False) -> None:
        self.workdir = workdir / self.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ram_bytes, self.offload = ram_bytes, offload
        self.engine_args: dict[str, Any] = {}  # more ``LLM`` arguments for its engines

    def missing(self) -> str | None:
        """Why this store cannot run on this machine (it is then skipped), or None."""
        return None

    def version(self) -> str | None:
        return None

    @abstractmethod
    def start(self) -> None:
        """Start every process and return once each answers; RuntimeError (with its log)
        otherwise."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every process as an operator would (SIGTERM, then kill); idempotent."""

    def restart(self) -> None:
        """Stop, then start on the same ports and data: what survives is what the store
        keeps across a restart."""
        self.stop()
        self.start()

    @abstractmethod
    def connector(self) -> dict[str, Any]:
        """The engine's ``kv_transfer_config``."""

    def engine_env(self) -> dict[str, str]:
        """Environment the engine process needs for this store's connector."""
        return {}

    @abstractmethod
    def pids(self) -> list[int]:
        """Process ids of the store's running processes."""


def peer_path(peer: str) -> Path:
    return PEERS_DIR / peer


def dist_version(folder: Path, dist: str) -> str | None:
    """Version of ``dist`` installed by ``pip --target folder`` (from its dist-info name)."""
    for info in folder.glob(f"{dist}-*.dist-info"):
        return info.name[len(dist) + 1 : -len(".dist-info")]
    return None


class KVStorePeer(PeerStore):
    """``kvstore serve`` (a host tier of ``ram_bytes``, 1 GiB as LMCache's L1 and Mooncake's
    segment unless a case shrinks them, over an LMDB disk tier) and ``KVStoreConnector``."""

    name = "kvstore"
    processes = ("kvstore serve",)

    def __init__(self, workdir: Path, ram_bytes: int = RAM_BYTES, offload: bool = False) -> None:
        super().__init__(workdir, ram_bytes, offload)
        host = f"{ram_bytes >> 20}MiB"
        self.server = _TiedServer(self.workdir / "data", host_capacity=host, disk_capacity="8GiB")

    def version(self) -> str | None:
        from kvstore import __version__

        return str(__version__)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()  # SIGTERM: blocks only in RAM spill to LMDB

    def connector(self) -> dict[str, Any]:
        return {
            "kv_connector": "KVStoreConnector",
            "kv_connector_module_path": "connectors.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kvstore_url": self.server.url},
        }

    def pids(self) -> list[int]:
        return [] if self.server.proc is None else [self.server.proc.pid]


class _TiedServer(ServerProc):
    tied = True


__all__ = [
    "RAM_BYTES",
    "KVStorePeer",
    "PeerStore",
    "TiedProc",
    "Usage",
    "dist_version",
    "free_port",
    "peer_path",
    "usage",
    "wait_tcp",
]
