"""Start ``kvstore-engine serve`` and ``kvstore-router`` as real processes on loopback ports,
for end-to-end tests and benchmarks (readiness by polling ``/health``, stop by SIGTERM), or
serve an app from a thread of this process (:class:`ThreadServer`) where processes would not
fit the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from server.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 180.0  # a shared 2-core machine imports torch slowly


def _script(name: str, module: str) -> list[str]:
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


class Proc:
    """One child process serving HTTP on ``port``; its output goes to a temp log file."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.cmd, self.port = cmd, port
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        fd, path = tempfile.mkstemp(prefix="kvstore-proc-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> Proc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT)
        return self.wait_ready() if wait else self

    def wait_ready(self) -> Proc:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[0]} exited:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.cmd[0]} did not become ready:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def engine_proc(model: str | Path, *, role: str = "both", kvstore: str | None = None,
                args: tuple[str, ...] = ()) -> Proc:
    port = free_port()
    cmd = [*_script("kvstore-engine", "engines.cli"), "serve", "--model", str(model),
           "--port", str(port), "--role", role, "--device", "cpu", *args]
    if kvstore:
        cmd += ["--kvstore", kvstore]
    # one torch thread per worker: several workers share few cores in tests and benches
    return Proc(cmd, port, env={"OMP_NUM_THREADS": "1"})


def router_proc(workers: list[str], *, policy: str = "kv", kvstore: str | None = None,
                prefill_workers: list[str] | None = None, args: tuple[str, ...] = ()) -> Proc:
    port = free_port()
    cmd = [*_script("kvstore-router", "engines.router.cli"), "--port", str(port),
           "--workers", ",".join(workers), "--policy", policy, *args]
    if prefill_workers:
        cmd += ["--prefill-workers", ",".join(prefill_workers)]
    if kvstore:
        cmd += ["--kvstore", kvstore]
    return Proc(cmd, port)


class ThreadServer:
    """An ASGI app (with a ``/health`` route) on a loopback port, served by uvicorn from a
    daemon thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError(f"server on {self.url} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
