"""What one data plane connection may have queued for prefetch.

The store bounds its prefetch queue over every caller (``max_prefetch_blocks``,
:mod:`kvstore.store.prefetch_queue`); each connection also holds at most
``max_prefetch_blocks_per_connection`` of it, so that one client cannot take the whole queue
with one connection. A connection's share counts the hashes of its prefetches until the
store has read them (hashes the store does not hold are done at once), and a prefetch past it
gets a ``busy`` error frame, queueing nothing. A prefetch sent with ``noreply`` (as the vLLM
connector sends them) is dropped silently then: it is a hint, and the later get reads the
blocks anyway.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from kvstore.protocol import FrameError
from kvstore.types import BlockHash
from server.dataplane.context import OpsContext, Session

# A prefetch of more hashes than this looks them up in a worker thread: the index lookups
# of 65,536 hashes would hold the event loop for tens of milliseconds. Smaller ones try the
# event loop first (no hop to delay the lookup that usually follows on the connection).
ON_LOOP_MAX = 1024


class PrefetchShare:
    """Queues prefetches for connections, each within ``per_connection`` blocks."""

    def __init__(self, ctx: OpsContext, per_connection: int) -> None:
        self._ctx = ctx
        self.per_connection = per_connection

    async def queue(self, session: Session, ns: str, hashes: list[BlockHash]) -> None:
        """Queue ``hashes`` of namespace ``ns`` for prefetch on behalf of ``session``; raises
        ``busy`` (a :class:`FrameError`, or the store's ``BusyError``) past a bound."""
        n = len(hashes)
        if session.prefetching + n > self.per_connection:
            raise FrameError(
                "busy", f"this connection has {session.prefetching} blocks queued for "
                f"prefetch; {n} more would pass max_prefetch_blocks_per_connection "
                f"({self.per_connection}): retry later, or get the blocks")
        store = self._ctx.store
        if n <= ON_LOOP_MAX:
            done: Future[int] = await self._ctx.now(store.prefetch, ns, hashes)
        else:
            done = await self._ctx.run(store.prefetch, ns, hashes)
        if done.done():
            return
        session.prefetching += n

        def finished(fut: asyncio.Future[int]) -> None:
            session.prefetching -= n
            if not fut.cancelled():
                fut.exception()  # a failed prefetch is a miss later, not an error now

        asyncio.wrap_future(done).add_done_callback(finished)
