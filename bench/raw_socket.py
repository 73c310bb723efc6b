"""The raw-socket baseline of the data plane benches: the same block bytes over a plain Python
socket (TCP on loopback, or a Unix socket) between two processes, as fast as Python moves them.

The sender writes with scatter-gather ``sendmsg`` straight from its buffers; the receiver reads
with ``recv_into`` preallocated buffers, one per block. The only framing is an 8-byte request
(op, byte count) and a one-byte put acknowledgement, so whatever kvstore spends above this is
its protocol, its store and its copies. The server side is ``python bench/raw_socket.py``: a
thread per connection, one preallocated buffer that puts land in and gets are served from.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

REQUEST = struct.Struct(">II")  # op, bytes
PUT, GET = 1, 2
SOCK_BUF = 4 << 20  # as the data plane sets on both ends
IOV_MAX = 512


def tune(sock: socket.socket) -> None:
    """The socket options the data plane uses: big kernel buffers, no Nagle on TCP."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def send_all(sock: socket.socket, pieces: Sequence[memoryview]) -> None:
    """``sendmsg`` until every byte of ``pieces`` is out (no join, no copy in Python)."""
    views = [p for p in pieces if p.nbytes]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while sent:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view, view.nbytes, socket.MSG_WAITALL)
        if not got:
            raise ConnectionResetError("raw socket peer closed")
        view = view[got:]


# -- the server process ------------------------------------------------------------------------
def _serve_conn(conn: socket.socket) -> None:
    tune(conn)
    store = bytearray()
    head = bytearray(REQUEST.size)
    with conn:
        while True:
            try:
                recv_exact(conn, memoryview(head))
            except (ConnectionResetError, OSError):
                return
            op, size = REQUEST.unpack(head)
            if len(store) < size:
                store = bytearray(size)
            view = memoryview(store)[:size]
            if op == PUT:
                recv_exact(conn, view)
                conn.sendall(b"k")
            else:
                send_all(conn, [view])


def serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_conn, args=(conn,), daemon=True).start()


# -- the client side ---------------------------------------------------------------------------
class RawServer:
    """``python bench/raw_socket.py`` as a child process listening on a loopback TCP port and
    a Unix socket; :meth:`connect` opens a :class:`RawClient` to either."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kvraw-")
        self.path = str(Path(self._dir.name) / "raw.sock")
        self.proc = subprocess.Popen([sys.executable, __file__, "--unix", self.path],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def connect(self, unix: bool = False) -> RawClient:
        if unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.path)
        else:
            sock = socket.create_connection(("127.0.0.1", self.port))
        tune(sock)
        return RawClient(sock)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._dir.cleanup()


class RawClient:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._ack = bytearray(1)

    def put(self, blocks: Sequence[bytes | bytearray]) -> None:
        """Send the blocks back to back; returns once the server has them all."""
        size = sum(map(len, blocks))
        send_all(self.sock, [memoryview(REQUEST.pack(PUT, size)), *(memoryview(b) for b in blocks)])
        recv_exact(self.sock, memoryview(self._ack))

    def get_into(self, dest: Sequence[bytearray]) -> None:
        """Receive ``sum(len(d))`` bytes from the server into the buffers, in order."""
        size = sum(map(len, dest))
        self.sock.sendall(REQUEST.pack(GET, size))
        for d in dest:
            recv_exact(self.sock, memoryview(d))

    def close(self) -> None:
        self.sock.close()


def main() -> int:
    p = argparse.ArgumentParser(description="raw-socket bench server: prints its TCP port")
    p.add_argument("--unix", required=True, help="also listen on this Unix socket path")
    args = p.parse_args()
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.unix)
    unix.bind(args.unix)
    unix.listen()
    threading.Thread(target=serve, args=(unix,), daemon=True).start()
    print(tcp.getsockname()[1], flush=True)
    serve(tcp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
