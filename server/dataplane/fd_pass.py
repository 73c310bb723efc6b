"""Sending a file descriptor with a reply frame (``SCM_RIGHTS``) over a Unix-socket connection.

asyncio transports cannot send ancillary data, so the frame that carries the descriptor goes
out with ``sendmsg`` on a duplicate of the connection's socket. That is safe only with nothing
queued in the transport (the bytes would overtake it): the caller sends this reply when the
transport's write buffer is empty, which holds for a connection that serves one frame at a
time and whose client waits for each reply (``shm_map`` is such a call).
"""

from __future__ import annotations

import array
import os
import socket
from typing import Any

from kvstore.protocol.frame import Buffer, FrameError


def is_unix(transport: Any) -> bool:
    """Whether ``transport`` is a Unix-socket connection (descriptors can travel on it)."""
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.family == socket.AF_UNIX


def send_with_fds(transport: Any, pieces: list[Buffer], fds: list[int]) -> None:
    """Write the frame ``pieces`` with ``fds`` attached to its first byte. Raises
    :class:`FrameError` (nothing sent) when the transport still has bytes queued or is not a
    Unix socket."""
    if not is_unix(transport):
        raise FrameError("unavailable", "descriptors travel only over the Unix socket")
    if transport.get_write_buffer_size():
        raise FrameError("busy", "replies are still queued on this connection; retry")
    data = b"".join(bytes(p) for p in pieces)
    # a duplicate descriptor of the same socket: closing it leaves the connection open
    dup = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
    try:
        sent = dup.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     array.array("i", fds))])
    except BlockingIOError:
        raise FrameError("busy", "the connection's socket buffer is full; retry") from None
    finally:
        dup.close()
    if sent < len(data):  # a tiny frame into an empty socket buffer: not expected, but safe
        transport.write(data[sent:])
