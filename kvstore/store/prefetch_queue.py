"""The store's prefetch work: a few threads, and a bound on the blocks waiting for them.

A prefetch only queues work, and a caller can queue faster than the threads read: unbounded,
600 requests of 65,536 hashes held 4 GiB of keys. The queue holds at most ``max_blocks``
blocks, queued or being read, all callers together; a request that would pass it is refused
whole with :class:`~kvstore.errors.BusyError` (a prefetch is a hint: the caller's later get
reads the blocks anyway). The store queues only blocks it holds below the top tier, so hashes
it does not know cost nothing here. The threads read a request in chunks of at most
``chunk_bytes``, giving back the room of each chunk as it lands: a request's blocks are never
all in memory at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from kvstore.errors import BusyError
from kvstore.types import BlockKey

CHUNK_BYTES = 16 << 20  # what one prefetch thread reads into memory at once


class PrefetchQueue:
    """Prefetch work on ``workers`` threads, at most ``max_blocks`` blocks queued or running."""

    def __init__(self, workers: int, max_blocks: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="kvstore-prefetch")
        self.max_blocks = max_blocks
        self._queued = 0  # blocks submitted and not yet read
        self._lock = threading.Lock()  # submit runs on callers' threads, _run on the pool's

    @property
    def queued(self) -> int:
        """Blocks queued or being read now."""
        return self._queued

    def submit(self, work: Callable[[list[BlockKey]], int], keys: list[BlockKey], *,
               block_bytes: int, done: int = 0) -> Future[int]:
        """Run ``work`` over ``keys`` in chunks on the prefetch threads; the future resolves
        to ``done`` plus what the chunks' ``work`` returned. Raises
        :class:`~kvstore.errors.BusyError`, queueing nothing, if ``keys`` would take the queue
        past ``max_blocks``."""
        if not keys:
            ready: Future[int] = Future()
            ready.set_result(done)
            return ready
        with self._lock:
            if self._queued + len(keys) > self.max_blocks:
                raise BusyError(
                    f"the server has {self._queued} blocks queued for prefetch; "
                    f"{len(keys)} more would pass max_prefetch_blocks ({self.max_blocks}): "
                    "retry later, or get the blocks")
            self._queued += len(keys)
        try:
            return self._pool.submit(self._run, work, keys, block_bytes, done)
        except BaseException:  # shut down: nothing will run
            self._give(len(keys))
            raise

    def _run(self, work: Callable[[list[BlockKey]], int], keys: list[BlockKey],
             block_bytes: int, done: int) -> int:
        step = max(1, CHUNK_BYTES // max(1, block_bytes))
        left = len(keys)
        try:
            for start in range(0, len(keys), step):
                chunk = keys[start:start + step]
                done += work(chunk)
                left -= len(chunk)
                self._give(len(chunk))
        finally:
            self._give(left)
        return done

    def _give(self, n: int) -> None:
        if n:
            with self._lock:
                self._queued -= n

    def shutdown(self) -> None:
        """Drop the work still queued and wait for the chunks being read."""
        self._pool.shutdown(wait=True, cancel_futures=True)
