"""A real ``kvstore serve`` process for tests, benches and soak runs: free loopback ports, a
temp data dir, readiness by polling ``/healthz``, and stop by SIGTERM (or ``kill -9``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 120.0  # the test machines are shared and slow to import torch/fastapi


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kvstore_cmd() -> list[str]:
    script = Path(sys.executable).parent / "kvstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvstore"]


class ServerProc:
    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None,
                 host_capacity: str = "64MiB", disk_capacity: str = "256MiB") -> None:
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.data_port = free_port()
        self.extra_args = ["--host-capacity", host_capacity, "--disk-capacity", disk_capacity,
                           "--log-level", "warning", *args]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"

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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen([*kvstore_cmd(), "serve", *self.args], cwd=ROOT,
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvstore serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"kvstore serve did not become healthy:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def kill(self) -> None:
        """``kill -9``: no cleanup at all."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> ServerProc:
        self.stop()
        return self.start()
