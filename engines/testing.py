"""Start ``kvstore-engine serve`` and ``kvstore-router`` as real processes on loopback ports,
for end-to-end tests and benchmarks (readiness by polling ``/health``, stop by SIGTERM), or
serve an app from a thread of this process (:class:`ThreadServer`) where processes would not
fit the machine."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvstore.testing.proc import ChildProc, console_script, free_port, http_ok

STARTUP_S = 180.0  # a shared 2-core machine imports torch slowly


class Proc(ChildProc):
    """One child process serving HTTP on ``port``; its output goes to a temp log file.
    ``nice`` (>= 0, added to this process's niceness) and ``cpus`` (a core set) are applied to
    it as soon as it is spawned, before its imports start any thread (threads inherit both)."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str] | None = None, *,
                 nice: int = 0, cpus: set[int] | None = None) -> None:
        if nice < 0:
            raise ValueError("nice must be >= 0 (raising a priority needs privileges)")
        fd, path = tempfile.mkstemp(prefix="kvstore-proc-", suffix=".log")
        os.close(fd)
        super().__init__(cmd[0], Path(path), env=env)
        self.cmd, self.port, self.nice, self.cpus = cmd, port, nice, cpus

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> Proc:
        self.spawn(self.cmd)
        assert self.proc is not None
        if self.nice:
            mine = os.getpriority(os.PRIO_PROCESS, 0)  # the child's, as it inherited it
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, min(19, mine + self.nice))
        if self.cpus is not None:
            os.sched_setaffinity(self.proc.pid, self.cpus)
        return self.wait_ready() if wait else self

    def wait_ready(self) -> Proc:
        """Wait until ``/health`` answers 200 (RuntimeError with the log if not)."""
        self.wait_http(f"{self.url}/health", STARTUP_S)
        return self


def token_file(token: str) -> Path:
    """A mode-0600 temp file holding ``token``, for a ``--token-file`` flag."""
    fd, path = tempfile.mkstemp(prefix="kvstore-token-")
    os.write(fd, f"{token}\n".encode())
    os.close(fd)  # mkstemp made it 0600
    return Path(path)


def engine_proc(model: str | Path, *, role: str = "both", kvstore: str | None = None,
                args: tuple[str, ...] = (), nice: int = 0,
                cpus: set[int] | None = None, token: str | None = None) -> Proc:
    """A worker process. ``nice`` > 0 lowers its CPU priority, so that a router and
    clients sharing its cores are not starved by it; ``cpus`` pins it to those cores, so that
    workers pinned apart never take CPU from each other (as on a real fleet, where each has
    its own accelerator). ``token``: its ``--token-file``'s (every route but ``/health``,
    and the admin route at all, need it)."""
    port = free_port()
    cmd = [*console_script("kvstore-engine", "engines.cli"), "serve", "--model", str(model),
           "--port", str(port), "--role", role, "--device", "cpu", *args]
    if token:
        cmd += ["--token-file", str(token_file(token))]
    if kvstore:
        cmd += ["--kvstore", kvstore]
    # one torch thread per worker: several workers share few cores in tests and benches
    return Proc(cmd, port, env={"OMP_NUM_THREADS": "1"}, nice=nice, cpus=cpus)


def router_proc(workers: list[str], *, policy: str = "kv", kvstore: str | None = None,
                prefill_workers: list[str] | None = None, args: tuple[str, ...] = (),
                token: str | None = None, worker_token: str | None = None) -> Proc:
    """A router process. ``token``: its own ``--token-file``'s; ``worker_token``: the
    workers' (default: ``token``)."""
    port = free_port()
    cmd = [*console_script("kvstore-router", "engines.router.cli"), "--port", str(port),
           "--workers", ",".join(workers), "--policy", policy, *args]
    if token:
        cmd += ["--token-file", str(token_file(token))]
    if worker_token:
        cmd += ["--worker-token-file", str(token_file(worker_token))]
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
            if http_ok(f"{self.url}/health", timeout=1.0):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"server on {self.url} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
