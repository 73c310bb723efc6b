"""Many readers, or one remap: the disk tier's gate between LMDB reads and ``set_mapsize``
(a remap invalidates open read transactions and the memoryviews taken from them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RemapGate:
    """Many readers, or one remap: ``set_mapsize`` must not run under an open read txn."""

    def __init__(self) -> None:
        # enter/leave take the plain Lock under the Condition directly, and are methods rather
        # than a context manager: the gate is taken once per get_many, and Condition's
        # Python-level __enter__ (or a generator) costs as much as the LMDB lookups of a small
        # batch. The Condition is only waited on when a remap is under way.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0
        self._remapping = False

    def enter(self) -> None:
        with self._lock:
            while self._remapping:
                self._cond.wait()
            self._readers += 1

    def leave(self) -> None:
        with self._lock:
            self._readers -= 1
            if self._remapping and not self._readers:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            self._remapping = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._lock:
                self._remapping = False
                self._cond.notify_all()
