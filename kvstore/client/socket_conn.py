"""One blocking data plane connection (TCP or Unix socket) for the sync client.

Block bytes never pass through msgpack: puts go out with scatter-gather ``sendmsg`` straight
from the caller's buffers, and each block of a reply is received into its own ``bytes`` (or
the caller's buffer) with ``MSG_WAITALL``: one kernel copy each way.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.client.errors import KVStoreUnavailableError, ProtocolError, from_reply
from kvstore.client.landed import landed, reply_sums
from kvstore.client.summed import frame_groups
from kvstore.protocol.frame import PREFIX, PREFIX_BYTES, Buffer, decode_header

if TYPE_CHECKING:
    from kvstore.client.exchange import Answer, Call

_IOV_MAX = 512


class FrameSocket:
    def __init__(self, sock: socket.socket, timeout: float) -> None:
        sock.settimeout(None)  # blocking mode, with kernel timeouts (MSG_WAITALL needs it)
        tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self.sock = sock
        self.timeout = timeout
        self._next_id = 1

    @classmethod
    def connect(cls, target: tuple[str, int] | str, timeout: float) -> FrameSocket:
        """Connect to ``(host, port)`` over TCP or to a Unix socket path."""
        try:
            if isinstance(target, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(target)
            else:
                sock = socket.create_connection(target, timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise KVStoreUnavailableError(f"cannot connect to the data plane {target}: {exc}") \
                from exc
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        return cls(sock, timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- wire -----------------------------------------------------------------------------
    def send(self, pieces: Sequence[Buffer]) -> None:
        views = [memoryview(p).cast("B") for p in pieces if memoryview(p).nbytes]
        while views:
            sent = self.sock.sendmsg(views[:_IOV_MAX])
            while sent and views:
                if sent >= views[0].nbytes:
                    sent -= views[0].nbytes
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0

    def recv_bytes(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n, socket.MSG_WAITALL)
            if not chunk:
                raise ConnectionResetError("data plane connection closed by the server")
            chunks.append(chunk)
            n -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def recv_into(self, view: memoryview) -> None:
        while view.nbytes:
            got = self.sock.recv_into(view, view.nbytes, socket.MSG_WAITALL)
            if not got:
                raise ConnectionResetError("data plane connection closed by the server")
            view = view[got:]

    # -- one request ----------------------------------------------------------------------
    def call(self, call: Call) -> Answer:
        """Send one planned request (see :mod:`kvstore.client.exchange`); its answer."""
        return self.request(call.header(), call.payload, call.into)

    def request(self, header: dict[str, Any], payload: Sequence[Buffer] = (),
                into: Sequence[Buffer | None] | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Send one request and read its reply: ``(reply, blocks)`` where ``blocks[i]`` is the
        bytes of block ``i`` (None where ``sizes[i] == -1``), or, with ``into``, True/False
        after copying into ``into[i]``. Raises the :mod:`kvstore.client.errors` error of an
        error reply; OSError if the connection broke."""
        rid = self._next_id
        self._next_id += 1
        try:
            for group in frame_groups({**header, "id": rid}, payload, alongside=True):
                self.send(group)
            if header.get("noreply"):
                return {}, []
            header_len, payload_len = PREFIX.unpack(self.recv_bytes(PREFIX_BYTES))
            reply = decode_header(self.recv_bytes(header_len))
            blocks = self._read_blocks(reply, payload_len, into)
        except BlockingIOError as exc:  # EAGAIN: the kernel timeouts set above ran out
            raise TimeoutError(f"no answer from the data plane within {self.timeout:g} s "
                               "(the client's timeout)") from exc
        if reply.get("id") != rid and reply.get("ok"):
            raise ProtocolError(f"reply id {reply.get('id')} does not match request {rid}")
        if not reply.get("ok"):
            raise from_reply(reply)
        return reply, blocks

    def _read_blocks(self, reply: dict[str, Any], payload_len: int,
                     into: Sequence[Buffer | None] | None) -> list[Any]:
        sizes = reply.get("sizes")
        if not isinstance(sizes, list) or sum(s for s in sizes if s > 0) != payload_len:
            if payload_len:
                self.recv_bytes(payload_len)  # keep the stream in sync, then complain
                raise ProtocolError("reply payload without matching sizes")
            return []
        sums = reply_sums(reply, len(sizes))
        out: list[Any] = []
        for i, size in enumerate(sizes):
            if size < 0:
                out.append(None if into is None else False)
            elif into is None:
                block: bytes | None = self.recv_bytes(size)
                out.append(block if landed(sums, i, block) else None)
            else:
                dest = into[i]
                if dest is None or memoryview(dest).nbytes < size:
                    self.recv_bytes(size)
                    out.append(False)
                else:
                    view = memoryview(dest).cast("B")[:size]
                    self.recv_into(view)
                    out.append(landed(sums, i, view))
        return out
