"""Raw data-plane sockets for the security tests: frames by hand, replies with a deadline, and
the server process's resident memory."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvstore.protocol.frame import PREFIX
from kvstore.testing.server import ServerProc

MiB = 1 << 20


@pytest.fixture
def dp_server(tmp_path: Path) -> Iterator[Callable[..., ServerProc]]:
    """Factory for real ``kvstore serve`` processes with their own flags; all are stopped at
    the end (test modules import this fixture by name)."""
    made: list[ServerProc] = []

    def make(*args: str, **kw: Any) -> ServerProc:
        proc = ServerProc(tmp_path / f"data{len(made)}", *args, **kw)
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.stop()


def rss_bytes(server: ServerProc) -> int:
    """The server process's anonymous resident memory (``RssAnon`` in ``/proc/PID/status``):
    buffers and heap, not the shared-memory slab or mapped files."""
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon line")


def connect(server: ServerProc, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.data_port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionResetError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_head(s: socket.socket) -> tuple[dict[str, Any], int]:
    """A reply's header and its payload length; the payload is left unread."""
    hlen, plen = PREFIX.unpack(recv_exact(s, PREFIX.size))
    return msgpack.unpackb(recv_exact(s, hlen)), plen


def request_head(s: socket.socket, header: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Send a frame without payload; the reply's header and payload length (the payload is
    read and dropped piece by piece, never held whole)."""
    s.sendall(frame(header))
    reply, plen = read_head(s)
    left = plen
    while left:
        chunk = s.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionResetError("closed inside a reply payload")
        left -= len(chunk)
    return reply, plen


def read_reply(s: socket.socket) -> dict[str, Any]:
    reply, plen = read_head(s)
    recv_exact(s, plen)
    return reply


def frame(header: dict[str, Any], payload_len: int | None = None) -> bytes:
    """Prefix and header of a frame whose prefix announces ``payload_len`` payload bytes."""
    head = msgpack.packb(header)
    return PREFIX.pack(len(head), 0 if payload_len is None else payload_len) + head


def call(s: socket.socket, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
    s.sendall(frame(header, len(payload)) + payload)
    return read_reply(s)


def hello(server: ServerProc, token: str | None) -> socket.socket:
    """A connection that has said hello (with ``token``)."""
    s = connect(server)
    reply = call(s, {"op": "hello", "id": 1, "token": token})
    assert reply["ok"] is True, reply
    return s


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``s`` within ``seconds`` (any error frame is read past)."""
    s.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if s.recv(1 << 16) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset: closed too
            return True
    return False


def h(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()
