"""The data plane's one byte budget: memory for frames being received and get replies being
built, shared by every connection.

Without it each connection could hold a whole ``max_frame_bytes`` frame, so the worst case
was ``max_connections`` times that (1024 x 256 MiB). A connection takes the bytes a frame
announces before it allocates a buffer for them, and gives them back when the frame has been
served. A take that does not fit waits its turn, first come first served (so a big frame is
not starved by a stream of small ones), for at most a bounded time; the caller then refuses
the frame with a clear error. The event loop is the only user: no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ByteBudget:
    """``total`` bytes handed out by :meth:`try_take` / :meth:`take`, returned by :meth:`give`."""

    def __init__(self, total: int) -> None:
        self.total = max(0, int(total))
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes now if they fit and nobody is waiting ahead; False otherwise."""
        if self._waiters or self.used + n > self.total:
            return False
        self.used += n
        return True

    async def take(self, n: int, timeout_s: float) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout_s`` for room; False if none came (or
        ``n`` can never fit). Cancelling the caller leaves nothing taken."""
        if self.try_take(n):
            return True
        if n > self.total:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except TimeoutError:
            return self._settle(n, fut, keep=True)
        except asyncio.CancelledError:
            self._settle(n, fut, keep=False)
            raise

    def give(self, n: int) -> None:
        """Return ``n`` bytes from a take; waiters that now fit get their turn, in order."""
        self.used -= n
        self._wake()

    def _settle(self, n: int, fut: asyncio.Future[None], *, keep: bool) -> bool:
        """A waiter that stopped waiting: drop its place in the queue, or, if the bytes were
        granted in the meantime, keep them (``keep``) or give them back. True if kept."""
        if fut.done():
            if keep:
                return True
            self.give(n)
            return False
        fut.cancel()
        self._waiters.remove((n, fut))
        self._wake()  # a big waiter ahead may have held back smaller ones
        return False

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.total:
            n, fut = self._waiters.popleft()
            self.used += n
            fut.set_result(None)
