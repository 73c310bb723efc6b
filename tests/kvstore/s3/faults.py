"""Fault injection at botocore's transport: a ``before-send`` hook answers chosen requests
with an S3 error response instead of sending them, so botocore's retry logic and our error
handling see exactly what a throttling or failing server would send."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from botocore.awsrequest import AWSResponse


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class Faults:
    """Answers the next ``count`` requests (None = all) whose operation is in ``ops`` (None =
    every operation) with ``status``/``code``; ``delay_s`` instead delays requests (a slow
    server) and lets them through. Register on every client of a tier with :meth:`attach`."""

    def __init__(
        self,
        status: int = 503,
        code: str = "SlowDown",
        *,
        ops: set[str] | None = None,
        count: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.status = status
        self.code = code
        self.ops = ops
        self.remaining = count
        self.delay_s = delay_s
        self.hits = 0
        self.active = True
        self._lock = threading.Lock()

    def attach(self, *clients: Any) -> Faults:
        for client in clients:
            client.meta.events.register("before-send.s3", self)
        return self

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
        op = event_name.rsplit(".", 1)[-1]
        if not self.active or (self.ops is not None and op not in self.ops):
            return None
        with self._lock:
            if self.remaining == 0:
                return None
            if self.remaining is not None:
                self.remaining -= 1
            self.hits += 1
        if self.delay_s:
            time.sleep(self.delay_s)
            return None
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{self.code}</Code>"
            f"<Message>injected by the test</Message></Error>"
        ).encode()
        headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        return AWSResponse(request.url, self.status, headers, _Raw(body))


def wait_for(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)
