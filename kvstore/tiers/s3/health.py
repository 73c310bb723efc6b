"""Health of the S3 back end: degraded or not, why, and the counters an operator reads.

The tier records every S3 outcome here. A fault (auth, missing bucket, throttling, unreachable,
5xx) marks the back end degraded; any later success clears it. While degraded, reads and
discovery answer "miss" without touching S3 (so a dead endpoint costs nothing per request) and
a background probe (:class:`Prober`) is the one thing that keeps asking S3, so the tier
recovers by itself when S3 comes back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from kvstore.tiers.s3.client import AUTH, FAULT_KINDS

log = logging.getLogger("kvstore.s3")


class HealthSnapshot(NamedTuple):
    """The tier's health at one moment (``reason`` is "" unless ``degraded``)."""

    degraded: bool
    reason: str
    last_error: str
    errors: int
    dropped: int
    corrupt: int
    recoveries: int


class S3Health:
    """Thread-safe degraded flag plus counters. ``errors`` counts every failed S3 request
    (missing keys are answers, not errors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.degraded = False
        self.reason = ""  # error kind of the fault that degraded the tier
        self.last_error = ""
        self.errors = 0
        self.dropped = 0  # demotions given up after retries
        self.corrupt = 0  # objects whose body failed their own checksum
        self.recoveries = 0

    def ok(self) -> None:
        """An S3 request succeeded: the back end serves again."""
        if self.degraded:  # racy read is fine: the locked path re-checks
            with self._lock:
                if self.degraded:
                    self.degraded = False
                    self.recoveries += 1
                    log.info("s3 tier recovered after %s", self.reason)

    def fail(self, kind: str, message: str) -> None:
        """An S3 request failed with error ``kind`` (see ``client.classify``)."""
        with self._lock:
            self.errors += 1
            self.last_error = message
            if kind in FAULT_KINDS:
                if not self.degraded:
                    log.warning("s3 tier degraded: %s", message)
                self.degraded = True
                self.reason = kind

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to the ``dropped`` or ``corrupt`` counter."""
        with self._lock:
            setattr(self, what, getattr(self, what) + n)

    @property
    def auth_failed(self) -> bool:
        return self.degraded and self.reason == AUTH

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return HealthSnapshot(self.degraded, self.reason if self.degraded else "",
                                  self.last_error, self.errors, self.dropped, self.corrupt,
                                  self.recoveries)


class Prober:
    """A daemon thread that calls ``probe()`` every ``interval_s`` while ``health`` is
    degraded. ``probe`` reports its own outcome to ``health`` (ok or fail)."""

    def __init__(self, health: S3Health, probe: Callable[[], object], interval_s: float) -> None:
        self._health = health
        self._probe = probe
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstore-s3-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if self._health.degraded:
                started = time.monotonic()
                self._probe()
                # A probe that hangs up to its timeouts must not be followed by another at once.
                self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
