"""One node's index updates: noted as the store changes, sent to Redis in batches.

The store tells :meth:`Publisher.placed` each changed block's tier mask (under its lock: the
publisher only notes it, the last change of a block winning). :meth:`Publisher.flush`, called
every ``publish_s`` by the node, sends what is noted as one pipelined batch, so the index lags
the store by at most ``publish_s`` plus one Redis round trip while Redis answers. When it does
not, the batch is kept (changes noted since win) up to ``max_pending`` blocks; past that the
notes are dropped and a full republication (:meth:`Publisher.resync`) follows once Redis is
back, as it does at start and whenever the node joins again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.link import RedisError
from kvstore.protocol.cluster import IndexView
from kvstore.types import BlockKey


def top_code(mask: int, codes: Sequence[int | None]) -> int | None:
    """The index code of the highest published tier in ``mask`` (None: none holds it)."""
    for pos, code in enumerate(codes):
        if code is not None and mask >> pos & 1:
            return code
    return None


class Publisher:
    """Notes placements and publishes them into an index for a node's slot. ``codes`` is each
    tier position's index code (None for a tier not published: the shared S3 tier)."""

    def __init__(self, codes: Sequence[int | None], max_pending: int) -> None:
        self._codes = list(codes)
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: dict[BlockKey, int] = {}
        self._published = self._batches = self._resyncs = self._dropped = 0
        self._overflowed = False

    def placed(self, changes: Sequence[tuple[BlockKey, int]]) -> None:
        with self._lock:
            self._pending.update(changes)
            if len(self._pending) > self._max_pending:
                self._dropped += len(self._pending)
                self._pending.clear()
                self._overflowed = True

    def flush(self, index: ClusterIndex, slot: int) -> None:
        """Send what is noted. Raises ``RedisError`` (the notes are kept) if Redis fails."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return
        try:
            self._send(index, slot, batch.items())
        except RedisError:
            with self._lock:
                batch.update(self._pending)  # what was noted meanwhile is newer
                self._pending = batch
            raise

    def take_overflow(self) -> bool:
        """Whether notes were dropped since the last call (a resync is owed)."""
        with self._lock:
            owed, self._overflowed = self._overflowed, False
            return owed

    def resync(self, index: ClusterIndex, slot: int, chunks: Iterable[list[tuple[BlockKey, int]]],
               stop: Callable[[], bool]) -> bool:
        """Publish every block of ``chunks`` (the store's placements) for ``slot``; False if
        ``stop()`` turned true first. Raises ``RedisError`` if Redis fails."""
        for chunk in chunks:
            if stop():
                return False
            self._send(index, slot, chunk)
        with self._lock:
            self._resyncs += 1
        return True

    def _send(self, index: ClusterIndex, slot: int, changes: Iterable[tuple[BlockKey, int]]
              ) -> None:
        out = [(ns, h, top_code(mask, self._codes)) for (ns, h), mask in changes]
        if out:
            index.publish(slot, out)
        with self._lock:
            self._published += len(out)
            self._batches += 1

    def view(self) -> IndexView:
        with self._lock:
            return IndexView(pending=len(self._pending), published=self._published,
                             batches=self._batches, resyncs=self._resyncs,
                             dropped=self._dropped)
