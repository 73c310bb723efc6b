"""The store's one lock, with a non-blocking hold for callers on an event loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kvstore.errors import WouldBlock


class StoreLock:
    """A re-entrant lock over the ledger, leases, reservations and memory-tier copies.
    ``with lock:`` waits for it; :meth:`hold` with ``nowait`` raises
    :class:`~kvstore.errors.WouldBlock` instead of waiting."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> StoreLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextmanager
    def hold(self, nowait: bool) -> Iterator[None]:
        if not self._lock.acquire(blocking=not nowait):
            raise WouldBlock("the store is busy")
        try:
            yield
        finally:
            self._lock.release()
