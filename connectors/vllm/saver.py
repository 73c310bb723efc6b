"""The connector's save path in a worker: page snapshots taken on the engine thread, stored by
one background thread.

:meth:`Saver.save` runs in ``wait_for_save`` (after the forward pass that filled the pages,
before the scheduler can free or reuse them): it copies the pages into a snapshot buffer and
queues it, so the engine never waits for the network on the save path. The thread stores each
snapshot through its own :class:`~connectors.vllm.store_link.StoreLink`, so a slow save never
holds up a load on the engine thread's link. Snapshot buffers come back to a small pool for the
next saves; saves beyond :data:`MAX_PENDING_SAVE_BYTES` are dropped (a future miss, counted as
``save_errors``) rather than queued without bound.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

import torch

from connectors.vllm.stats import KVStoreConnectorStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from connectors.vllm.metadata import KVStoreConnectorMetadata
    from connectors.vllm.pages import PagedKV
    from connectors.vllm.store_link import StoreLink

MAX_PENDING_SAVE_BYTES = 512 << 20  # saves beyond this are dropped rather than queued
SAVE_POOL_BYTES = 128 << 20  # snapshot buffers of finished saves kept for the next ones


class Saver:
    """Snapshots of a worker's pages and the thread that stores them; owns the queue, the
    buffer pool, the pending byte count and the save counters (all under one lock)."""

    def __init__(self, pages: PagedKV, make_link: Callable[[], StoreLink]) -> None:
        self._pages = pages
        self._make_link = make_link
        self._lock = threading.Lock()
        self._stats = KVStoreConnectorStats()
        # (hashes, snapshot rows, the pooled buffer they live in)
        self._queue: queue.Queue[tuple[list[bytes], torch.Tensor, torch.Tensor] | None] = \
            queue.Queue()
        self.pool: list[torch.Tensor] = []  # idle snapshot buffers, guarded by _lock
        self._pending_bytes = 0
        self._thread = threading.Thread(target=self._loop, name="kvstore-save", daemon=True)
        self._thread.start()

    def save(self, meta: KVStoreConnectorMetadata) -> None:
        """Snapshot the pages named by this step's saves and queue them for storing."""
        if not meta.saves:
            return
        start = time.perf_counter()
        pages = self._pages
        ids = [b for t in meta.saves for b in t.block_ids]
        extra = [[b for t in meta.saves for b in t.extra_ids[k]]
                 for k in range(pages.num_groups - 1)]
        hashes = [h for t in meta.saves for h in t.hashes]
        size = len(ids) * pages.block_bytes
        if self._pending_bytes + size > MAX_PENDING_SAVE_BYTES:
            # The store cannot keep up; a dropped save is only a future miss.
            with self._lock:
                self._stats.add("save_errors", len(ids))
            return
        buf = self._buffer(len(ids))
        data = pages.gather(ids, out=buf[: len(ids)], extra_ids=extra)
        with self._lock:
            self._pending_bytes += size
            self._stats.add("save_s", time.perf_counter() - start)
        self._queue.put((hashes, data, buf))

    def _buffer(self, n: int) -> torch.Tensor:
        """A snapshot buffer of at least ``n`` rows: the smallest idle one that fits, else a
        new one (touched once here, so the engine thread does not fault its pages in)."""
        with self._lock:
            fits = [i for i, b in enumerate(self.pool) if b.shape[0] >= n]
            if fits:  # by index: tensors do not compare as booleans
                return self.pool.pop(min(fits, key=lambda i: self.pool[i].shape[0]))
        return torch.zeros((n, self._pages.block_bytes), dtype=torch.uint8)

    def _loop(self) -> None:
        link = self._make_link()
        try:
            while (item := self._queue.get()) is not None:
                hashes, data, buf = item
                start = time.perf_counter()
                ok = link.put(hashes, [memoryview(row.numpy()) for row in data])
                with self._lock:
                    pooled = sum(b.numel() for b in self.pool)
                    if pooled + buf.numel() <= SAVE_POOL_BYTES:
                        self.pool.append(buf)
                    self._pending_bytes -= data.numel()
                    self._stats.add("saved_blocks" if ok else "save_errors", len(hashes))
                    if ok:
                        self._stats.add("saved_bytes", data.numel())
                    self._stats.add("save_s", time.perf_counter() - start)
        finally:
            link.close()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued saves to be stored; True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self._pending_bytes > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._pending_bytes <= 0

    def take_stats(self) -> KVStoreConnectorStats | None:
        """The save counters since the last call (None when nothing happened)."""
        with self._lock:
            return self._stats.take()

    def stop(self, timeout_s: float) -> None:
        """Store what is queued (up to ``timeout_s``), then end the thread."""
        self.flush(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)
