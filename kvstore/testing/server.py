"""A real ``kvstore serve`` process for tests, benches and soak runs: free loopback ports, a
temp data dir, readiness by polling ``/healthz``, and stop by SIGTERM (or ``kill -9``)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvstore.testing.proc import ChildProc, free_port

STARTUP_S = 120.0  # the test machines are shared and slow to import torch/fastapi


def kvstore_cmd() -> list[str]:
    """The ``kvstore`` command of this environment (``python -m kvstore`` without the script)."""
    script = Path(sys.executable).parent / "kvstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvstore"]


class ServerProc(ChildProc):
    """``kvstore serve`` on two free loopback ports (REST and data plane) over ``data_dir``;
    its output goes to ``<data_dir>-server.log`` beside the data dir."""

    grace_s = 60.0

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None,
                 host_capacity: str = "64MiB", disk_capacity: str = "256MiB") -> None:
        self.data_dir = Path(data_dir)
        super().__init__("kvstore serve",
                         self.data_dir.parent / f"{self.data_dir.name}-server.log", env=env)
        self.port = free_port()
        self.data_port = free_port()
        self.extra_args = ["--host-capacity", host_capacity, "--disk-capacity", disk_capacity,
                           "--log-level", "warning", *args]

    @property
    def args(self) -> list[str]:
        """``kvstore serve`` arguments, built at each start: a test may point ``data_dir``
        elsewhere between a stop and a start."""
        return ["--data-dir", str(self.data_dir), "--port", str(self.port),
                "--data-port", str(self.data_port), *self.extra_args]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProc:
        """Start and wait until ``/healthz`` answers 200 (RuntimeError with the log if not)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.spawn([*kvstore_cmd(), "serve", *self.args])
        self.wait_http(self.url + "/healthz", STARTUP_S)
        return self

    def restart(self) -> ServerProc:
        self.stop()
        return self.start()
