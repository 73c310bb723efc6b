"""How a client gets the server's host slab: the descriptor of its anonymous memfd, received
with ``SCM_RIGHTS`` on the data plane's Unix socket after an authenticated ``hello``.

The slab has no name in ``/dev/shm``: only a client the server authenticated (and trusts with
the whole slab: the admin token, or any client of a server without tenant tokens) receives it.
The exchange runs on a short connection of its own, under a fresh owner id, so that closing it
never drops the pins of the client's own connections.
"""

from __future__ import annotations

import contextlib
import os
import socket

from kvstore.client.errors import ProtocolError, from_reply
from kvstore.client.socket_conn import FrameSocket
from kvstore.protocol import Hello
from kvstore.protocol.frame import PREFIX, PREFIX_BYTES, decode_header, encode_frame
from kvstore.protocol.shm import ShmMap, ShmMapReply


def receive_slab(path: str, token: str | None, timeout: float) -> tuple[int, ShmMapReply]:
    """The slab's descriptor (the caller owns it: map it, then close it) and its layout.
    Raises the client error of the server's refusal (``forbidden`` for a tenant token,
    ``unauthenticated`` for a bad one), or ``KVStoreUnavailableError``."""
    conn = FrameSocket.connect(path, timeout)
    try:
        conn.request(Hello(token, None).to_header())
        conn.send(encode_frame({**ShmMap().to_header(), "id": 0}))
        head, fds, _, _ = socket.recv_fds(conn.sock, PREFIX_BYTES, 1)
        try:
            if not head:
                raise ConnectionResetError("data plane connection closed by the server")
            head += conn.recv_bytes(PREFIX_BYTES - len(head))
            header_len, payload_len = PREFIX.unpack(head)
            reply = decode_header(conn.recv_bytes(header_len))
            if payload_len:
                raise ProtocolError("shm_map reply with a payload")
            if not reply.get("ok"):
                raise from_reply(reply)
            if len(fds) != 1:
                raise ProtocolError(f"shm_map reply came with {len(fds)} descriptors, not 1")
            return fds[0], ShmMapReply.from_header(reply)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
    finally:
        conn.close()
