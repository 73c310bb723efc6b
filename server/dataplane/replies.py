"""How a data plane connection writes its reply frames: one ``writev`` per frame where the
event loop allows it, a bounded wait on a client that does not read its replies, descriptors
passed beside a reply, and the last error frame before a close.

It owns the connection's side of write back-pressure (``pause``/``resume`` from the
transport); :mod:`server.dataplane.conn` decides what to send and when.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvstore.protocol.frame import Buffer, FrameError, encode_frame, error_reply
from server.dataplane.fd_pass import send_with_fds


class ReplyWriter:
    """Writes frames to one transport; ``timeout_s`` bounds how long a reply may wait for a
    client that stopped reading (then the connection is aborted)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._gather = False  # the transport's writelines sends buffers as they are

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._gather = type(transport).__module__.startswith("uvloop")

    def detach(self) -> None:
        """The connection is gone: nothing more is written, nothing waits."""
        self.closed = True
        self._writable.set()

    def pause(self) -> None:
        self._writable.clear()

    def resume(self) -> None:
        self._writable.set()

    async def send(self, pieces: list[Buffer], drain: bool = False) -> None:
        """Write a frame. With ``drain``, return only once the transport holds none of it
        (the kernel has it all, or the connection is gone): its buffers may be reused then."""
        transport = self.transport
        if self.closed or transport is None:
            return
        if drain:  # paused while anything is buffered, resumed when nothing is
            transport.set_write_buffer_limits(high=0, low=0)
        if self._gather:  # one writev for the frame, straight from our buffers
            transport.writelines(pieces)
        else:  # asyncio's writelines joins the pieces (a copy): one write each instead
            for piece in pieces:
                transport.write(piece)
        if not self._writable.is_set():  # a client that does not read its replies
            try:
                await asyncio.wait_for(self._writable.wait(), self.timeout_s)
            except TimeoutError:
                self.abort()
        if drain and not transport.is_closing():
            transport.set_write_buffer_limits()

    def send_fds(self, reply: dict[str, Any], rid: Any, fds: list[int]) -> dict[str, Any] | None:
        """Send ``reply`` with the descriptors ``fds``; None once sent, else the reply (or an
        error reply) to send the usual way."""
        if self.closed or self.transport is None or not reply.get("ok"):
            return reply
        try:
            send_with_fds(self.transport, encode_frame(reply), fds)
        except FrameError as exc:
            return error_reply(rid, exc.code, exc.message)
        return None

    def fail(self, exc: FrameError) -> None:
        """Write an error frame for ``exc``, then close (the close flushes it first)."""
        assert self.transport is not None
        for piece in encode_frame(error_reply(0, exc.code, exc.message)):
            self.transport.write(piece)
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
