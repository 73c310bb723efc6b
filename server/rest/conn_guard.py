"""The REST plane's HTTP protocol: uvicorn's, plus a deadline on request headers and a cap on
the connections still sending them.

uvicorn has no header timeout: a client that opens a connection and sends half a request line
holds it forever, and uvicorn's ``limit_concurrency`` counts such connections, so 55 of them
under a limit of 50 turned every request, ``/healthz`` included, into a 503. Here a connection
must finish each request's headers within ``rest_header_timeout_s`` of its first byte (or of
the connection's start) or it is answered 408 and closed; and when more than
``rest_max_pending_connections`` connections are waiting for their headers, the oldest waiter
is closed, so a flood of half-open connections can never starve one that sends its request
at once. Requests in flight are bounded by :mod:`server.rest.gate`, which counts only
requests that passed the token check, and never ``/healthz``.

Each request's scope also carries the extension ``kvstore.flushed``: an awaitable that returns
once the connection's transport holds none of the bytes written so far, so that a response
written from borrowed memory (a pinned slab place, :mod:`server.rest.slab_body`) knows when
that memory is free again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

FLUSHED = "kvstore.flushed"  # the scope extension: ``await flushed(timeout_s) -> bool``
_TIMEOUT_TEXT = b"request headers not received in time (rest_header_timeout_s)\n"
_TIMEOUT_REPLY = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                  % (len(_TIMEOUT_TEXT), _TIMEOUT_TEXT))


def guarded_http(header_timeout_s: float, max_pending: int,
                 base: type[asyncio.Protocol] = AutoHTTPProtocol,
                 live: set[Any] | None = None) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)``; each call has its own pending set,
    so each server counts only its own connections. ``live``, when given, holds the open
    connections (for the metrics)."""
    opened: set[Any] = set() if live is None else live
    base_cls: Any = base
    pending: OrderedDict[Any, None] = OrderedDict()  # oldest first

    class HeaderDeadlineProtocol(base_cls):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            opened.add(self)
            self._arm()

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            if self._deadline is None and (before is None or before.response_complete):
                self._arm()  # the first bytes of a new request: its headers are on the clock
            super().data_received(data)
            if self.cycle is not before:  # the parser built a new request: headers complete
                self._disarm()
                self.cycle.scope.setdefault("extensions", {})[FLUSHED] = self._flushed

        def connection_lost(self, exc: Exception | None) -> None:
            opened.discard(self)
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)
            pending[self] = None
            while len(pending) > max_pending:
                next(iter(pending))._expire()

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            pending.pop(self, None)

        async def _flushed(self, timeout_s: float) -> bool:
            """Return once the transport holds none of what was written (the kernel has it
            all, or the connection is gone); False, having aborted the connection, if that
            takes more than ``timeout_s`` (a client that stopped reading)."""
            transport = self.transport
            if transport.is_closing() or not transport.get_write_buffer_size():
                return True
            transport.set_write_buffer_limits(high=0, low=0)  # paused until it is all out
            try:
                await asyncio.wait_for(self.flow.drain(), timeout_s)
            except TimeoutError:
                transport.abort()
                return False
            finally:
                if not transport.is_closing():
                    transport.set_write_buffer_limits()  # uvicorn's (the transport's defaults)
            return True

        def _expire(self) -> None:
            self._disarm()
            transport = self.transport
            if transport is not None and not transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    transport.write(_TIMEOUT_REPLY)
                transport.close()

    return HeaderDeadlineProtocol
