"""The store's one lock, with a non-blocking hold for callers on an event loop.

Who takes it is stated once, at the top of :mod:`kvstore.store.facade`: the facade, around
every call into a part; the few parts that must let it go while a persistent tier answers
take it themselves, and only through this object (``with lock``, :meth:`StoreLock.hold`,
:meth:`StoreLock.scan`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from kvstore.errors import WouldBlock

K = TypeVar("K")
R = TypeVar("R")


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
    def hold(self, nowait: bool = False) -> Iterator[None]:
        """``with lock.hold(nowait):`` takes the lock; with ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` rather than wait for it."""
        if not self._lock.acquire(blocking=not nowait):
            raise WouldBlock("the store is busy")
        try:
            yield
        finally:
            self._lock.release()

    def scan(self, keys: Sequence[K], n: int, read: Callable[[Sequence[K]], R], *,
             nowait: bool = False) -> Iterator[R]:
        """``read`` of each run of ``n`` keys, each run under the lock (:meth:`hold`), so that
        a long scan lets other calls go on between runs; the lock is not held across a
        ``yield``."""
        for i in range(0, len(keys), n):
            with self.hold(nowait):
                out = read(keys[i:i + n])
            yield out

