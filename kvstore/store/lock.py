"""The store's one lock, with a non-blocking hold for callers on an event loop.

Who takes it is stated once, at the top of :mod:`kvstore.store.facade`: the facade, around
every call into a part; the few parts that must let it go while a persistent tier answers
take it themselves, and only through :meth:`StoreLock.hold`.
"""

from __future__ import annotations

import threading

from kvstore.errors import WouldBlock


class StoreLock:
    """A re-entrant lock over the ledger, leases, reservations and memory-tier copies.
    ``with lock:`` waits for it; :meth:`hold` with ``nowait`` raises
    :class:`~kvstore.errors.WouldBlock` instead of waiting."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._nowait = _NoWait(self._lock)

    def __enter__(self) -> StoreLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def hold(self, nowait: bool = False) -> StoreLock | _NoWait:
        """``with lock.hold(nowait):`` takes the lock; with ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` rather than wait for it. The one way a part takes
        the lock itself (see :mod:`kvstore.store.facade` for which parts may)."""
        return self._nowait if nowait else self


class _NoWait:
    """The lock taken only if it is free at once (no state of its own: shared by threads)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise WouldBlock("the store is busy")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
