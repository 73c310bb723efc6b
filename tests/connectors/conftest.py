"""A real ``kvstore serve`` subprocess for the connector's store-link tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Start, stop and restart one server on fixed ports and data folder."""

    def __init__(self, data_dir: Path) -> None:
        self.port, self.data_port = _free_port(), _free_port()
        self.data_dir = data_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "kvstore", "serve", "--port", str(self.port),
            "--data-port", str(self.data_port), "--data-dir", str(self.data_dir),
            "--host-capacity", "64MiB", "--log-level", "warning",
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "kvstore serve exited at start"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("kvstore serve did not start within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data")
    srv.start()
    yield srv
    srv.stop()
