"""The store's life after start: whether it is closed, the prefetch workers, the background
demoter, flushing the tiers, and the shutdown that stops them in order (prefetch, demoter,
host path, spill to disk, tiers).

:class:`Lifecycle` owns the closed flag, the prefetch pool and the demoter thread. It takes
no lock: the facade holds the store lock around :meth:`Lifecycle.closing`,
:meth:`Lifecycle.flush` and :meth:`Lifecycle.shut`, and not around :meth:`Lifecycle.stop`,
whose demoter lands its batch in flight under the lock first, nor around the waits of a
write for the room the demoter frees (:meth:`Lifecycle.wait_room`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from kvstore.config import StoreConfig
from kvstore.errors import KVStoreError
from kvstore.store.demoter import Demoter
from kvstore.store.host_path import HostPath
from kvstore.store.placer import Placer
from kvstore.store.prefetch_queue import PrefetchQueue
from kvstore.store.stack import TierStack
from kvstore.store.tier_writer import NewItems
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")


class Lifecycle:
    """Open until closed; runs prefetches and (with ``background_demotion``) the host tier's
    ``demoter`` meanwhile."""

    def __init__(self, config: StoreConfig, stack: TierStack, placer: Placer, host: HostPath,
                 demoter: Demoter | None) -> None:
        self._stack, self._placer, self._host, self._demoter = stack, placer, host, demoter
        self._spill_on_close = config.spill_on_close
        self.closed = False
        self.spilled = 0  # memory-only blocks the close wrote to the persistent tier
        self._prefetcher = PrefetchQueue(config.prefetch_workers, config.max_prefetch_blocks)

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

    def make_way(self, put: NewItems) -> NewItems:
        """``put`` (a put's tier and items, :meth:`TierWriter.new_items
        <kvstore.store.tier_writer.TierWriter.new_items>`) once :meth:`wait_room` has room
        for its items in that tier."""
        pos, items, _ = put
        self.wait_room(pos, sum(self._stack.tiers[pos].charges([m.size for _, _, m in items])))
        return put

    def open_with_room(self, block_bytes: int, count: int, nowait: bool) -> None:
        """:meth:`check_open`; then, unless ``nowait`` (a caller on an event loop, which goes
        to a thread if the write would have to make room), :meth:`wait_room` for ``count``
        new host blocks of ``block_bytes``."""
        self.check_open()
        host = self._stack.host
        if not nowait and host is not None and count > 0:
            self.wait_room(host, self._stack.tiers[host].charge(block_bytes) * count)

    def wait_room(self, pos: int, need: int) -> None:
        """Before a write of ``need`` bytes into tier ``pos``, called without the store lock:
        while the demoter settles that tier and they do not fit yet, wait for it to free room
        (:meth:`~kvstore.store.demoter.Demoter.wait_room`) rather than evict under the lock,
        which would hold every other call for the disk's write."""
        demoter = self._demoter
        if demoter is not None and demoter.pos == pos:
            demoter.wait_room(need)

    def flush(self) -> None:
        """Flush every tier (persistent ones sync to their medium)."""
        for tier in self._stack.tiers:
            tier.flush()

    def closing(self) -> bool:
        """Mark the store closed; False if it was already."""
        if self.closed:
            return False
        self.closed = True
        return True

    def stop(self) -> None:
        """Stop prefetching, then the demoter (its batch in flight lands first; the spill
        does the rest)."""
        self._prefetcher.shutdown()
        if self._demoter is not None:
            self._demoter.close()

    def shut(self) -> int:
        """Free the host path's places, spill memory-only blocks to disk (``spill_on_close``)
        and close every tier. Returns how many memory-only blocks the spill could not write
        (they are lost)."""
        lost = 0
        if self._stack.host is not None:
            self._host.close()
        if self._spill_on_close:
            self.spilled, lost = self._placer.spill()
            if lost:
                log.error("shutdown: %d memory-only blocks could not be written to the "
                          "persistent tier and are lost", lost)
        for tier in self._stack.tiers:
            try:
                tier.close()
            except Exception:
                log.exception("closing the %s tier failed", tier.name)
        return lost
