"""Many readers, or one remap: the disk tier's gate between LMDB reads and ``set_mapsize``
(a remap invalidates open read transactions and the memoryviews taken from them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RemapGate:
    """Many readers, or one remap: ``set_mapsize`` must not run under an open read txn."""

    def __init__(self) -> None:
        # A plain Lock under the Condition and enter/leave methods rather than a
        # contextmanager: the gate is taken once per get_many, and the default RLock plus a
        # generator cost more than the LMDB lookups of a small batch.
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._remapping = False

    def enter(self) -> None:
        with self._cond:
            while self._remapping:
                self._cond.wait()
            self._readers += 1

    def leave(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers and self._remapping:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._remapping = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._remapping = False
                self._cond.notify_all()
