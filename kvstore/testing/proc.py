"""One child process for tests and benches: started with its output in a log file, polled
until ready, stopped by SIGTERM (killed after a grace period) or killed outright.

The kvstore server, engine and router launchers and the SeaweedFS server all run through
:class:`ChildProc`, so a process is started, waited for and stopped in one way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the checkout: children run from here
POLL_S = 0.2  # between readiness checks
PR_SET_PDEATHSIG = 1  # prctl option: the signal a child gets when its parent dies


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the process that started it dies, even
    by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def console_script(name: str, module: str) -> list[str]:
    """The command of console script ``name`` of this environment, or ``module.main`` run by
    this interpreter where the script is not installed."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200 now; no answer counts as not yet."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


class ChildProc:
    """A child process whose output goes to ``log_path`` (appended), run from ``cwd`` with
    ``env`` over this process's environment. ``proc`` is None while nothing runs."""

    grace_s = 30.0  # how long stop() waits after SIGTERM before it kills
    tied = False  # True: the child is killed when this process dies (die_with_parent)

    def __init__(
        self, name: str, log_path: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
    ) -> None:
        self.name = name
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, cmd: list[str]) -> None:
        """Start ``cmd`` and return at once; the child holds its own descriptor of the log."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent if self.tied else None,
            )

    def wait_until(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Poll ``ready`` until it returns True (True), the child exits or
        ``time.monotonic()`` passes ``deadline`` (False)."""
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if ready():
                return True
            time.sleep(POLL_S)
        return False

    def wait_http(self, url: str, timeout_s: float) -> None:
        """Wait until ``GET url`` answers 200. Raises RuntimeError with the log's tail if the
        child exits first, or (after killing it) if ``timeout_s`` passes."""
        if self.wait_until(lambda: http_ok(url), time.monotonic() + timeout_s):
            return
        rc = None if self.proc is None else self.proc.poll()
        if rc is not None:
            raise RuntimeError(f"{self.name} exited {rc}:\n{self.log()}")
        self.kill()
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log()}")

    def log(self, tail: int = 5000) -> str:
        """The last ``tail`` characters of the child's output ("" if there is none)."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM, wait up to ``timeout`` (default ``grace_s``), then kill; returns the exit
        code (0 when nothing ran). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(self.grace_s if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def kill(self) -> None:
        """``kill -9``: no cleanup at all."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
