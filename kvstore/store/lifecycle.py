"""The store's life after start: whether it is closed, the prefetch workers, the background
demoter, flushing the tiers, and the shutdown that stops them in order (prefetch, demoter,
host path, spill to disk, tiers).

:class:`Lifecycle` owns the closed flag, the prefetch pool and the demoter thread; it
reaches the other parts through :class:`~kvstore.store.parts.Parts` and takes the store lock
itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from kvstore.config import StoreConfig
from kvstore.errors import KVStoreError
from kvstore.store.demoter import Demoter
from kvstore.store.parts import Parts
from kvstore.store.prefetch_queue import PrefetchQueue
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")


class Lifecycle:
    """Open until :meth:`close`; runs prefetches and (with ``background_demotion``) the
    host tier's demoter meanwhile."""

    def __init__(self, config: StoreConfig, parts: Parts) -> None:
        self._parts = parts
        self._spill_on_close = config.spill_on_close
        self._demoter = self._start_demoter() if config.background_demotion else None
        self.closed = False
        self._prefetcher = PrefetchQueue(config.prefetch_workers, config.max_prefetch_blocks)

    def _start_demoter(self) -> Demoter | None:
        """The host tier's background settler, where a persistent tier sits right below."""
        p = self._parts
        host = p.stack.host
        tiers = p.stack.tiers
        if host is None or host + 1 >= len(tiers) or not tiers[host + 1].persistent:
            return None
        demoter = Demoter(p.stack, p.ledger, p.placer, p.exits, p.tally, p.leases, p.lock, host,
                          p.checks)
        p.placer.settlers[host] = demoter.signal
        return demoter

    def check_open(self) -> None:
        """Raise :class:`~kvstore.errors.KVStoreError` once the store is closed."""
        if self.closed:
            raise KVStoreError("the store is closed")

    def prefetch(self, work: Callable[[list[BlockKey]], int], keys: list[BlockKey], *,
                 block_bytes: int, done: int = 0) -> Future[int]:
        """Run ``work`` over ``keys`` on the prefetch workers (see
        :meth:`PrefetchQueue.submit <kvstore.store.prefetch_queue.PrefetchQueue.submit>`:
        :class:`~kvstore.errors.BusyError` past ``max_prefetch_blocks``)."""
        return self._prefetcher.submit(work, keys, block_bytes=block_bytes, done=done)

    def settled(self, timeout: float | None = None) -> bool:
        """Wait until background demotion has nothing left to do; False on timeout. Returns
        at once without it."""
        return self._demoter is None or self._demoter.wait_idle(timeout)

    def flush(self) -> None:
        """Flush every tier (persistent ones sync to their medium), under the store lock."""
        with self._parts.lock:
            for tier in self._parts.stack.tiers:
                tier.flush()

    def close(self) -> int:
        """Stop prefetching, free the host path's places, spill memory-only blocks to disk
        (``spill_on_close``), and close every tier. Returns how many memory-only blocks the
        spill could not write (they are lost; 0 on a second call). Idempotent."""
        p = self._parts
        with p.lock:
            if self.closed:
                return 0
            self.closed = True
        self._prefetcher.shutdown()
        if self._demoter is not None:  # its batch in flight lands first; spill does the rest
            self._demoter.close()
        lost = 0
        with p.lock:
            if p.stack.host is not None:
                p.host.close()
            if self._spill_on_close:
                lost = p.placer.spill()
                if lost:
                    log.error("shutdown: %d memory-only blocks could not be written to the "
                              "persistent tier and are lost", lost)
            for tier in p.stack.tiers:
                try:
                    tier.close()
                except Exception:
                    log.exception("closing the %s tier failed", tier.name)
        return lost
