"""A block's bytes sent straight from its pinned place in the host slab: the REST GET of a
block the host tier holds makes no copy of it (the kernel copies from the slab to the socket,
as it does for a socket get).

The route pins the block (:class:`~server.dataplane.direct_get.DirectGet`, as the data plane
does) and :class:`SlabResponse` writes views of its places, then waits until the connection's
transport holds none of them (the protocol's ``kvstore.flushed`` extension,
:mod:`server.rest.conn_guard`) before it drops the pin and ends the response: the bytes sent
are the block's even when it is deleted or evicted meanwhile. A client that does not take
them within ``timeout_s`` has its connection aborted; the pin's lease is longer than that.
Where the server offers no such extension (another ASGI server, a test client), each view is
copied as it is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import Response

from kvstore.protocol import Buffer
from server.rest.conn_guard import FLUSHED


class SlabResponse(Response):
    """``200 application/octet-stream`` of ``size`` bytes, the ``pieces`` in order; awaits
    ``release`` once they have left (or cannot be sent), never before."""

    media_type = "application/octet-stream"

    def __init__(self, pieces: Sequence[Buffer], size: int,
                 release: Callable[[], Awaitable[None]] | None, timeout_s: float) -> None:
        super().__init__(headers={"content-length": str(size)}, media_type=self.media_type)
        self.pieces = pieces
        self.release = release
        self.timeout_s = timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        flushed = scope.get("extensions", {}).get(FLUSHED)
        if flushed is None:  # no way to know when views have left: send copies
            copies = [bytes(p) for p in self.pieces]
            if self.release is not None:
                await self.release()
            await self._send(send, copies, end=True)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:  # uvicorn's send waits, unbounded, for a client that stopped reading
            async with asyncio.timeout_at(deadline):
                await self._send(send, self.pieces, end=False)
        except TimeoutError:
            pass  # flushed() below finds the bytes still there and aborts the connection
        finally:  # never free the pinned places while the transport may still read them
            sent = await flushed(max(0.0, deadline - loop.time()))
            if self.release is not None:
                await self.release()
        if sent:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Any, pieces: Sequence[Buffer], *, end: bool) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        if end:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
